"""Chapter 4 on paper and in one process: schedules as data, the validator, the simulator against the
closed forms, the executor on one rank, the errors that guard against silent wrong answers, and the CLI's
usage errors. Runs no ranks; `test_pipeline_ranks.py` does.

Parity tolerance: float32's in `distlab.parity.TOLERANCE`, 1e-5 (justified in `pipeline.parity`). No
test asserts on timings.
"""

from __future__ import annotations

import re

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from distlab.models import MLP, regression_data
from distlab.pipeline import figures
from distlab.pipeline.actions import Action, Schedule
from distlab.pipeline.communication import DeadlockError, add_communication
from distlab.pipeline.cost_model import bubble_fraction, predicted_peak_stash
from distlab.pipeline.executor import run_schedule
from distlab.pipeline.parity import merge, step_parity
from distlab.pipeline.partition import balanced_boundaries, boundary_shapes, check_boundaries, parameter_costs
from distlab.pipeline.schedules import gpipe_order, make_schedule, one_f_one_b_order
from distlab.pipeline.simulate import simulate, timeline_stats
from distlab.pipeline.train import pipeline_step, reference_step, split_microbatches
from distlab.pipeline.validate import validate

matplotlib.use("Agg")
GRID = [(name, p, m, v) for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 5, 8)
        for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3))
        if name != "interleaved" or m % p == 0]


@pytest.mark.parametrize("name,p,m,v", GRID)
def test_schedules_are_valid_and_match_the_closed_forms(name: str, p: int, m: int, v: int) -> None:
    s = make_schedule(name, p, m, v)
    validate(s, "gloo")
    if name != "interleaved":  # posting each run of messages together suffices on NCCL too
        validate(s, "nccl")
    validate(make_schedule(name, p, m, v, rendezvous_safe=True), "nccl")
    stats = timeline_stats(simulate(s, 1.0 / v, 2.0 / v), p)
    assert stats.mean_bubble == pytest.approx(bubble_fraction(p, m, v), abs=1e-12)
    assert stats.peak_stash == predicted_peak_stash(name, p, m, v)
    sends = sum(a.op.startswith("send") for actions in s.actions for a in actions)
    assert sends == (2 * m * (p * v - 1) if p > 1 else 0)  # each boundary between ranks, both ways


def test_interleaved_lazy_order_is_not_rendezvous_safe_and_validate_says_so() -> None:
    with pytest.raises(DeadlockError, match="rendezvous_safe=True"):
        validate(make_schedule("interleaved", 2, 4, 2), "nccl")


def test_validate_names_what_is_wrong() -> None:
    good = make_schedule("1f1b", 2, 2)
    lists = [list(x) for x in good.actions]
    i = next(k for k, a in enumerate(lists[0]) if a.op == "send_fwd")
    lists[0][i] = Action("send_fwd", 0, 0, peer=0)
    with pytest.raises(ValueError, match=r"peer=0, but stage 1 lives on rank 1; use peer=1"):
        validate(Schedule("bad peer", 2, 2, 1, tuple(map(tuple, lists))))
    missing_b = add_communication("missing B", [[Action("F", 0, 0), Action("F", 1, 0), Action("B", 0, 0)]],
                                  1, 2)
    with pytest.raises(ValueError, match=r"B1 of stage 0 runs 0 times \(on rank 0\)"):
        validate(missing_b)
    twice = Schedule("twice", 1, 1, 1, ((Action("F", 0, 0), Action("F", 0, 0), Action("B", 0, 0)),))
    with pytest.raises(ValueError, match=r"F0 of stage 0 runs 2 times"):
        validate(twice)
    with pytest.raises(ValueError, match=r"B0 comes before F0 of stage 0"):
        validate(Schedule("b first", 1, 1, 1, ((Action("B", 0, 0), Action("F", 0, 0)),)))
    with pytest.raises(ValueError, match=r"stage 1 lives on rank 1, not rank 0"):
        validate(Schedule("wrong rank", 2, 1, 1, ((Action("F", 0, 1),), ())))


def test_partition_balances_parameters_and_rejects_skipped_or_repeated_layers() -> None:
    layers = MLP([16, 64, 64, 64, 64, 8]).layers
    assert balanced_boundaries(parameter_costs(layers), 4) == [0, 2, 4, 6, 9]
    with pytest.raises(ValueError, match=r"num_stages=10 is more than the 9 layers.*at most 9 stages"):
        balanced_boundaries(parameter_costs(layers), 10)
    with pytest.raises(ValueError, match=r"boundaries=\[0, 4, 8\] must start at 0 and end at the number of "
                                         r"layers 9.*skipped"):
        check_boundaries([0, 4, 8], 9)
    with pytest.raises(ValueError, match=r"stage 1, layers \[5, 3\), goes backwards: layers 3..4 would run "
                                         r"twice"):
        check_boundaries([0, 5, 3, 9], 9)
    with pytest.raises(ValueError, match=r"stage 1, layers \[4, 4\), would be empty"):
        check_boundaries([0, 4, 4, 9], 9)


def test_bad_sizes_name_the_value_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"m=5 to be a multiple of p=2.*use m=4 or m=6"):
        make_schedule("interleaved", 2, 5, 2)
    with pytest.raises(ValueError, match=r"m=0 microbatches.*use m >= 1"):
        make_schedule("1f1b", 2, 0)
    with pytest.raises(ValueError, match=r"schedule='zb' is not known"):
        make_schedule("zb", 2, 2, 2)
    with pytest.raises(ValueError, match=r"v=2 model chunks per rank only applies to the 'interleaved'"):
        make_schedule("naive", 2, 1, 2)
    with pytest.raises(ValueError, match=r"v=0 model chunks per rank must be a positive integer"):
        bubble_fraction(4, 8, 0)
    with pytest.raises(ValueError, match=r"schedule='zb' is not known"):
        predicted_peak_stash("zb", 2, 2)
    X, y = regression_data(10, 4, 2, seed=0)
    with pytest.raises(ValueError, match=r"batch size 10 is not divisible by m=4.*choose m from "
                                         r"\[1, 2, 5, 10\]"):
        split_microbatches(X, y, 4)
    with pytest.raises(ValueError, match=r"batch size 0 is smaller than m=2 microbatches, so some would be "
                                         r"empty; use a batch of at least 2"):
        split_microbatches(X[:0], y[:0], 2)
    with pytest.raises(ValueError, match=r"the batch has 10 inputs but 9 targets"):
        split_microbatches(X, y[:9], 2)


def test_one_rank_pipeline_equals_one_process_and_refuses_silent_mistakes() -> None:
    """p = 1 runs in this process (no messages), and every guard of run_schedule fires before a step."""
    sizes = [8, 16, 16, 4]
    X, y = regression_data(12, 8, 4, seed=0)
    reference = reference_step(sizes, X, y)
    for name, m, v in (("gpipe", 3, 1), ("1f1b", 4, 1), ("interleaved", 2, 3)):
        step = pipeline_step(sizes, X, y, make_schedule(name, 1, m, v))
        assert step_parity(merge([step]), reference), (name, m, v)
    with pytest.raises(ValueError, match=r"is for p=2 ranks, but the group has 1; build the "
                                         r"schedule with p=1"):
        pipeline_step(sizes, X, y, make_schedule("1f1b", 2, 2))
    with pytest.raises(TypeError, match=r"group=0: a pipeline takes its ProcessGroup"):
        pipeline_step(sizes, X, y, make_schedule("1f1b", 1, 2), 0)
    with pytest.raises(ValueError, match=r"targets of shape \(12,\) do not match the MLP's output width"):
        pipeline_step(sizes, X, y[:, 0], make_schedule("1f1b", 1, 2))
    layers = MLP(sizes).layers
    bounds = [0, 2, 5]
    stages = {0: torch.nn.Sequential(*layers[:2]), 1: torch.nn.Sequential(*layers[2:])}
    shapes = dict(enumerate(boundary_shapes(layers, bounds, X[:4])))
    s = make_schedule("1f1b", 1, 3, 1)
    with pytest.raises(ValueError, match=r"stages=\[0, 1\] on rank 0, but '1f1b' with p=1, v=1 runs stages "
                                         r"\[0\] there"):
        run_schedule(s, stages, list(X.chunk(3)), list(y.chunk(3)), F.mse_loss, shapes)
    s = make_schedule("interleaved", 1, 3, 2)
    with pytest.raises(ValueError, match=r"microbatches: microbatch sizes \[1, 5\] differ"):
        run_schedule(s, stages, [X[:5], X[5:10], X[10:11]], list(y.chunk(3)), F.mse_loss, shapes)
    with pytest.raises(ValueError, match=r"targets: got 2 microbatches for a schedule with m=3"):
        run_schedule(s, stages, list(X.chunk(3)), list(y.chunk(2)), F.mse_loss, shapes)
    with pytest.raises(ValueError, match=r"microbatches: a microbatch is empty"):
        run_schedule(s, stages, [X[:0]] * 3, list(y.chunk(3)), F.mse_loss, shapes)
    with pytest.raises(ValueError, match=r"input_shapes has no shape for stage\(s\) \[1\]"):
        run_schedule(s, stages, list(X.chunk(3)), list(y.chunk(3)), F.mse_loss, {0: shapes[0]})
    order = [a for a in gpipe_order(1, 3)[0] if (a.op, a.microbatch) != ("B", 2)]
    skipping = add_communication("skips B2", [order], 1, 3)
    with pytest.raises(ValueError, match=r"B2 of stage 0 runs 0 times"):
        run_schedule(skipping, {0: torch.nn.Sequential(*layers)}, list(X.chunk(3)), list(y.chunk(3)),
                     F.mse_loss, {})


def test_validate_finds_b_before_f_and_deadlocks() -> None:
    good = one_f_one_b_order(2, 2)
    swapped = [list(reversed(good[0])), good[1]]
    with pytest.raises(DeadlockError, match="B before F"):
        add_communication("x", swapped, 2, 2)
    no_warmup = [[Action("F", 0, 0), Action("B", 0, 0), Action("F", 1, 0), Action("B", 1, 0)],
                 [Action("F", 0, 1), Action("F", 1, 1), Action("B", 0, 1), Action("B", 1, 1)]]
    with pytest.raises(DeadlockError, match=r"rank 0 at action 1 \(B0 of stage 0\) waits for the gradient"):
        add_communication("no warm-up", no_warmup, 2, 2)
    three = [[Action("F", 0, 0), Action("B", 0, 0), Action("F", 1, 0), Action("B", 1, 0)],
             *one_f_one_b_order(3, 2)[1:]]
    with pytest.raises(DeadlockError, match="rank 0 at action 1"):
        add_communication("short warm-up", three, 3, 2)
    with pytest.raises(ValueError, match=r"rank 0, action 0 has op 'send_fwd'; a compute order holds only"):
        add_communication("messages", [[Action("send_fwd", 0, 0)]], 1, 1)


def test_exercise_check_diagnoses_mistakes_on_paper() -> None:
    from distlab.pipeline.exercises import check_one_f_one_b

    def no_warmup(p, m):
        return [[x for i in range(m) for x in (("F", i), ("B", i))] for _ in range(p)]

    rep = check_one_f_one_b(no_warmup, run=False)
    assert not rep and "rank 0 runs 1 forwards before its first backward" in str(rep)
    assert "[FAIL] p=2, m=2" in str(rep) and "[pass] p=1, m=1" in str(rep)

    def reversed_warmup(p, m):  # rank r warms up with r forwards instead of p - r - 1
        orders = []
        for r in range(p):
            w = min(r, m)
            order = [("F", i) for i in range(w)]
            for i in range(m - w):
                order += [("F", w + i), ("B", i)]
            orders.append(order + [("B", i) for i in range(m - w, m)])
        return orders

    rep = check_one_f_one_b(reversed_warmup, run=False)
    assert not rep and "the compute order deadlocks" in str(rep)
    assert "rank 0 at action 1 (B0 of stage 0) waits" in str(rep)

    def missing_backward(p, m):
        return [[(a.op, a.microbatch) for a in order][:-1] for order in one_f_one_b_order(p, m)]

    rep = check_one_f_one_b(missing_backward, run=False)
    assert not rep and "missing backward for microbatch" in str(rep)
    assert "their gradients would never reach the weights" in str(rep)

    def gpipe_like(p, m):
        return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]

    rep = check_one_f_one_b(gpipe_like, run=False)
    assert not rep and "forwards before its first backward; 1F1B runs" in str(rep)
    assert "warm-up forwards too many" in str(rep) and "not 1F1B" in str(rep)

    def one_forward_too_many(p, m):  # rank 0 pulls its first steady-state F into the warm-up
        orders = [[(a.op, a.microbatch) for a in order] for order in one_f_one_b_order(p, m)]
        if p > 1 and m > p:
            first_b = next(i for i, a in enumerate(orders[0]) if a[0] == "B")
            orders[0].insert(first_b, orders[0].pop(first_b + 1))
        return orders

    rep = check_one_f_one_b(one_forward_too_many, run=False)
    assert not rep and "one warm-up forward too many: rank 0 runs 5 forwards" in str(rep), str(rep)

    def newest_backward_first(p, m):  # each B takes the newest stashed micro-batch instead of the oldest
        orders = []
        for order in one_f_one_b_order(p, m):
            stash: list[int] = []
            orders.append([("F", stash.append(a.microbatch) or a.microbatch) if a.op == "F"
                           else ("B", stash.pop()) for a in order])
        return orders

    rep = check_one_f_one_b(newest_backward_first, run=False)
    assert not rep and "rank 0 runs the backward of micro-batch 1 before that of micro-batch 0: the newest " \
        "micro-batch's backward first" in str(rep), str(rep)

    rep = check_one_f_one_b(lambda p, m: [[]], run=False)
    assert not rep and "must return a list with one list per rank" in str(rep)
    assert "<table>" in rep._repr_html_()


def test_figures_draw() -> None:
    for fig in (figures.schedules_figure(3, 3, 2), figures.bubble_figure(3, (3, 6)),
                figures.stash_figure(3, 6, 2)):
        assert fig.axes and fig.axes[0].get_title()


@pytest.mark.parametrize("argv,message", [
    (["--batch", "0"], r"--batch 0: a step needs samples to train on; use --batch 8"),
    (["--batch", "4"], r"batch size 4 is smaller than m=8 microbatches"),
    (["--batch", "60"], r"batch size 60 is not divisible by m=8"),
    (["-m", "0"], r"m=0 microbatches"),
    (["--schedule", "interleaved", "-m", "3", "-v", "2"], r"m=3 to be a multiple of p=2"),
    (["--world-size", "0"], r"argument --world-size: 0 must be at least 1"),
    (["--steps", "0"], r"argument --steps: 0 must be at least 1"),
    (["--sizes", "64,x,8"], r"--sizes '64,x,8' must be integers separated by commas"),
    (["--sizes", "64"], r"--sizes '64' needs at least two positive widths"),
    (["--sizes", "8,4", "--world-size", "2"], r"num_stages=2 is more than the 1 layers"),
    (["-m", "two"], r"argument -m: invalid int value: 'two'"),
])
def test_command_line_gives_usage_errors_before_starting_ranks(argv: list[str], message: str,
                                                               capsys: pytest.CaptureFixture) -> None:
    from distlab.pipeline.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m distlab.pipeline" in err
    assert re.search(message, err), err


def test_gpt_with_dropout_and_incomplete_results_are_refused() -> None:
    from distlab.models import GPTConfig
    from distlab.pipeline.gpt import gpt_pipeline_step

    config = GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=8, dropout=0.1)
    idx = torch.zeros(4, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"config.dropout=0.1: the pipeline draws dropout masks.*use "
                                         r"dropout=0.0"):
        gpt_pipeline_step(config, idx, idx, make_schedule("1f1b", 1, 2))
    X, y = regression_data(4, 8, 4, seed=0)
    step = pipeline_step([8, 4], X, y, make_schedule("gpipe", 1, 2))
    step.run.losses.clear()
    with pytest.raises(ValueError, match=r"no result holds the loss: pass the results of every rank"):
        merge([step])
