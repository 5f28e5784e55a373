"""Chapter 6, parallel folding (Liu et al. 2025): a block with tensor-parallel attention (tp x dp) and
expert-parallel experts (ep x edp) over the same ranks, against one process, at world sizes 1 to 4.

One launch per world size runs all its layouts (a launch costs seconds on two cores). float64: both
sides add the same terms in other orders; 1e-10 separates that from a bug (`distlab.parity`). The
batches differ between replicas and do not split evenly over tp, so the ranks route different numbers of
tokens, and k = 2 of 4 to 8 experts gives every expert a different load.
"""

from __future__ import annotations

import pytest
import torch

from distlab import launch
from distlab.moe.folding import check_folding, fold_meshes, folded_layout, rank_groups
from distlab.moe.folding_parity import FoldCase, fold_parity, run_case
from distlab.parity import compare

CASES = {
    1: [FoldCase(1, 1, [2])],
    2: [FoldCase(2, 2, [2]), FoldCase(1, 2, [2, 1]), FoldCase(2, 1, [1], capacity_factor=1.0)],
    3: [FoldCase(1, 3, [1, 2, 1], num_experts=6), FoldCase(3, 3, [2], n_head=3, num_experts=6),
        FoldCase(3, 1, [1], n_head=6, num_experts=3, capacity_factor=0.75)],
    4: [FoldCase(2, 2, [2, 1]), FoldCase(2, 4, [1, 2]), FoldCase(4, 2, [2]),
        FoldCase(1, 4, [1, 3, 2, 1], num_experts=8, capacity_factor=1.25)],
}


def _on_ranks(world: int) -> dict:
    out = {"results": fold_parity(CASES[world])}
    if world == 4:  # attention dp = 2, experts edp = 1: dividing the experts' gradients by edp is wrong
        case = CASES[4][1]
        meshes = fold_meshes(tp=case.tp, ep=case.ep)
        ours, want, _ = run_case(case, meshes)
        dp, edp = meshes.sizes()["dp"], meshes.sizes()["edp"]
        ours["gradients"] = {n: g * dp / edp if ".experts." in n else g for n, g in ours["gradients"].items()}
        out["averaged over edp"] = compare(ours, want, dtype=torch.float64)
    if world == 2:
        meshes = fold_meshes(tp=1, ep=2)
        try:
            run_case(FoldCase(1, 2, [3]), meshes)
        except ValueError as e:
            out["error"] = str(e)
    return out


@pytest.fixture(scope="module")
def runs():
    """Each world size's results, launched once on first use and shared by the tests."""
    done: dict[int, list[dict]] = {}

    def get(size: int) -> list[dict]:
        if size not in done:
            done[size] = launch.run(_on_ranks, size, size, timeout=120)
        return done[size]
    return get


@pytest.mark.parametrize("size", sorted(CASES))
def test_folded_block_matches_one_process(runs, size):
    results = runs(size)
    assert len(results) == size
    for res in results:
        for r in res["results"]:
            assert r.passed, f"rank {r.rank}: {r.report.verdict()} {r.report}"
            assert r.report.verdict().endswith("agree with one process within 1e-10: ok")
            assert len(r.report.differences["gradients"]) == 9 + 4 * r.case.num_experts  # every parameter


@pytest.mark.parametrize("size", sorted(CASES))
def test_every_rank_holds_its_experts_and_its_slice_of_the_tokens(runs, size):
    results = runs(size)
    for c, case in enumerate(CASES[size]):
        rows = [res["results"][c] for res in results]
        # the first rank of each edp group: one copy of the experts, which must hold each expert once
        held = sorted(e for r in rows if r.groups["edp"][0] == r.rank for e in r.experts)
        assert held == list(range(case.num_experts))
        assert all(len(r.experts) == case.num_experts // case.ep for r in rows)
        assert [r.tokens for r in rows] == case.group_sizes()
        assert sum(case.group_sizes()) == case.seq_len * sum(case.batch)


def test_expert_gradients_are_summed_over_edp_and_divided_by_dp(runs):
    for res in runs(4):  # dp = 2, edp = 1
        wrong = res["averaged over edp"]
        assert not wrong.passed
        assert wrong.failures() and all(".experts." in name for name in wrong.failures())


def test_a_batch_that_misses_a_replica_is_refused_on_every_rank(runs):
    for res in runs(2):
        assert res["error"] == ("batch=[3] must give one sequence count per dp replica (dp=2 with tp=1); "
                                "pass 2 numbers")


def test_folded_groups_tile_one_world():
    assert folded_layout(4, tp=2, ep=4) == {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]],
                                            "ep": [[0, 1, 2, 3]], "edp": [[0], [1], [2], [3]]}
    assert folded_layout(6, tp=2, ep=3) == {"tp": [[0, 1], [2, 3], [4, 5]], "dp": [[0, 2, 4], [1, 3, 5]],
                                            "ep": [[0, 1, 2], [3, 4, 5]], "edp": [[0, 3], [1, 4], [2, 5]]}
    assert rank_groups(3, 4, tp=2, ep=2) == {"tp": [2, 3], "dp": [1, 3], "ep": [2, 3], "edp": [1, 3]}
    for world, tp, ep in ((4, 2, 4), (4, 4, 2), (3, 1, 3), (6, 3, 2), (8, 2, 8)):
        for groups in folded_layout(world, tp=tp, ep=ep).values():
            assert sorted(r for g in groups for r in g) == list(range(world))
    assert check_folding(8, tp=2, ep=8) == {"tp": 2, "dp": 4, "ep": 8, "edp": 1}


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=2, ep=4, num_experts=6),
     "num_experts=6 is not divisible by ep=4: expert parallelism gives every rank the same number of "
     "experts; choose ep among 1, 2, 3, 6"),
    (dict(tp=4, ep=2, num_heads=6),
     "num_heads=6 is not divisible by tp=4: attention's tensor parallelism gives every rank whole heads; "
     "choose tp among 1, 2, 3, 6"),
    (dict(tp=2, dp=3, ep=4),
     "tp=2 x dp=3 = 6 ranks, but the world has 4: attention's grid tp x dp must cover every rank once; "
     "choose dp=2 or sizes whose product is 4"),
    (dict(tp=2, ep=2, edp=1),
     "ep=2 x edp=1 = 2 ranks, but the world has 4: the experts' grid ep x edp must cover every rank once; "
     "choose edp=2 or sizes whose product is 4"),
    (dict(tp=3, ep=2),
     "tp=3 does not divide the world of 4 ranks, so attention's grid tp x dp cannot tile it; choose tp "
     "among 1, 2, 4"),
    (dict(tp=0, ep=2), "tp=0 must be a positive integer (ranks along the tp axis); use tp=1 not to split"),
])
def test_bad_sizes_name_the_parameter_and_the_fix(kwargs, message):
    with pytest.raises(ValueError) as err:
        check_folding(4, **kwargs)
    assert str(err.value).startswith(message)


def test_bad_batches_and_no_process_group_are_refused():
    with pytest.raises(ValueError, match=r"batch=\[2, 0\] must list at least one sequence for every dp "
                                         r"replica"):
        FoldCase(1, 2, [2, 0])
    with pytest.raises(RuntimeError, match=r"fold_meshes\(\) needs a process group"):
        fold_meshes(tp=1, ep=1)
