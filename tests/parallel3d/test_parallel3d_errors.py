"""Chapter 9 without ranks: the plan's error messages, the command line's usage errors, the placement on
a chapter-8 cluster, the exercises' checks (a good and a bad answer each), and the figures."""

from __future__ import annotations

from itertools import permutations

import pytest
from matplotlib.figure import Figure

from distlab.mesh import coordinates, layout
from distlab.models import GPTConfig
from distlab.parallel3d import Plan3D, block_ranges, check_plan
from distlab.parallel3d.__main__ import main
from distlab.parallel3d.exercises import check_coordinates, check_placement
from distlab.parallel3d.figures import mesh_figure, placement_figure
from distlab.parallel3d.placement import assign, compare_placements, placement_table, predict_placement
from distlab.topology import Cluster

CONFIG = GPTConfig(vocab_size=24, block_size=12, n_layer=4, n_head=12, n_embd=24)


@pytest.mark.parametrize("plan, batch, seq, world, message", [
    (Plan3D(dp=2, pp=2, tp=2), 8, 12, 4, r"dp x pp x tp = 2 x 2 x 2 = 8, but the world has world_size=4 "
                                          r"ranks; choose sizes whose product is 4"),
    (Plan3D(pp=5), 8, 12, None, r"n_layer=4 blocks cannot fill pp=5 pipeline stages .* use pp <= 4"),
    (Plan3D(tp=5), 8, 12, None, r"n_head=12 is not divisible by tp=5; .* choose a tp that divides 12"),
    (Plan3D(dp=3), 8, 12, None, r"batch=8 sequences is not divisible by dp=3; .* a multiple of 3"),
    (Plan3D(dp=2, m=3), 8, 12, None, r"m=3 micro-batches do not divide the 4 sequences of each replica "
                                     r"\(batch=8 / dp=2\); choose m from \[1, 2, 4\]"),
    (Plan3D(zero_stage=3), 8, 12, None, r"zero_stage=3 is not supported with a pipeline; choose 0, 1 or 2"),
    (Plan3D(schedule="zbv"), 8, 12, None, r"schedule='zbv' is not supported in 3D; choose one of "
                                          r"gpipe, 1f1b"),
    (Plan3D(dp=0), 8, 12, None, r"dp=0 must be a positive integer; use dp=1 not to split over it"),
    (Plan3D(tp=4, sequence_parallel=True), 8, 10, None, r"seq=10 is not divisible by tp=4; sequence "
                                                        r"parallelism keeps seq/tp positions"),
    (Plan3D(), 8, 13, None, r"seq=13 exceeds block_size=12; use seq <= 12"),
])
def test_plan_errors_name_parameter_value_and_fix(plan, batch, seq, world, message):
    with pytest.raises(ValueError, match=message):
        check_plan(plan, CONFIG, batch, seq, world)


def test_vocab_and_dropout_are_checked_too():
    with pytest.raises(ValueError, match=r"vocab_size=25 is not divisible by tp=2"):
        check_plan(Plan3D(tp=2), GPTConfig(vocab_size=25, n_head=2, n_embd=8), 2, 8)
    with pytest.raises(ValueError, match=r"dropout=0.1: .* use dropout=0.0"):
        check_plan(Plan3D(), GPTConfig(vocab_size=24, dropout=0.1), 2, 8)
    with pytest.raises(ValueError, match=r"n_layer=2 blocks cannot fill pp=3"):
        block_ranges(2, 3)


@pytest.mark.parametrize("argv, message", [
    (["--dp", "2", "--pp", "2", "--world-size", "3"], "choose sizes whose product is 3"),
    (["--tp", "5"], "n_head=12 is not divisible by tp=5"),
    (["--dp", "0"], "argument --dp: 0 must be at least 1"),
    (["--zero-stage", "3"], "argument --zero-stage: invalid choice: 3"),
    (["--hidden", "25"], "argument --hidden: 25 is not divisible by --heads 12"),
])
def test_cli_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "pipeline stages (default: 2)" in capsys.readouterr().out


def test_cli_runs_and_checks_one_rank(capsys):
    """World size 1: the step on one rank (four micro-batches, ZeRO stage 1) against one process."""
    out = main(["--dp", "1", "--pp", "1", "--tp", "1", "--steps", "2", "--micro-batches", "4", "--json"])
    assert out["passed"] and out["ranks"][0]["same_as_predicted"]
    assert '"passed": true' in capsys.readouterr().out


def test_placement_keeps_tp_inside_a_server_and_the_wrong_one_costs_more():
    cluster = Cluster("DGX A100", 2)
    right, default, wrong = compare_placements(cluster)
    assert not right.axes["tp"].crosses_servers and right.axes["dp"].crosses_servers
    assert default.axes["pp"].crosses_servers and not default.axes["tp"].crosses_servers
    assert wrong.axes["tp"].crosses_servers
    assert wrong.axes["tp"].seconds > 5 * right.axes["tp"].seconds  # 25 GB/s NIC against 300 GB/s NVLink
    assert wrong.seconds > max(right.seconds, default.seconds)
    assert right.axes["tp"].GBps == 300 and wrong.axes["tp"].GBps == 25
    table = placement_table([right, default, wrong])
    assert table.splitlines()[0].startswith("placement") and "TP across servers (wrong)" in table
    gpu = assign(Plan3D(dp=2, pp=2, tp=4), cluster, ("dp", "pp", "tp"))
    assert [gpu[r] for r in layout(dp=2, pp=2, tp=4)["tp"][0]] == [f"n0/gpu{i}" for i in range(4)]


def test_placement_errors():
    cluster = Cluster("DGX A100", 2)
    with pytest.raises(ValueError, match=r"order=\('dp', 'tp'\) must list each of \('dp', 'pp', 'tp'\) once"):
        assign(Plan3D(dp=2, pp=2, tp=4), cluster, ("dp", "tp"))
    with pytest.raises(ValueError, match=r"the plan needs dp x pp x tp = 4 GPUs but the cluster has 16 "
                                         r"\(2 x 8\); choose sizes whose product is 16"):
        predict_placement("x", ("dp", "pp", "tp"), cluster, plan=Plan3D(dp=2, pp=2, tp=1))


def _good_coords(rank, dp, pp, tp):
    groups = layout(dp=dp, pp=pp, tp=tp)
    return (coordinates(rank, pp=pp, dp=dp, tp=tp),
            {d: next(g for g in groups[d] if rank in g) for d in groups})


def test_exercise_a_good_and_bad_answers():
    assert check_coordinates(_good_coords)

    def dp_outermost(rank, dp, pp, tp):
        coords, peers = _good_coords(rank, dp, pp, tp)
        return {"dp": rank // (pp * tp) % dp, "pp": rank // tp % pp, "tp": rank % tp}, peers

    report = check_coordinates(dp_outermost)
    assert not report and "the mesh puts pp outermost, then dp, then tp" in str(report)

    def without_self(rank, dp, pp, tp):
        coords, peers = _good_coords(rank, dp, pp, tp)
        return coords, {d: [r for r in g if r != rank] for d, g in peers.items()}

    assert "include the rank itself" in str(check_coordinates(without_self))


def test_exercise_b_good_and_bad_answers():
    def best(cluster, plan):
        return min(permutations(("dp", "pp", "tp")),
                   key=lambda o: predict_placement("", o, cluster, plan=plan).seconds)

    assert check_placement(best)
    report = check_placement(lambda cluster, plan: ("tp", "pp", "dp"))
    assert not report and "splits tp groups over servers" in str(report) and "put tp last" in str(report)
    assert "ValueError" in str(check_placement(lambda cluster, plan: ("tp",)))


def test_figures_draw():
    assert isinstance(mesh_figure(2, 2, 2), Figure) and isinstance(mesh_figure(1, 3, 1), Figure)
    assert isinstance(placement_figure(), Figure)
