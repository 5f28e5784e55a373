"""DualPipeV (DeepSeek-AI 2024, sec. 3.2.1; the V form of DeepSeek's DualPipe repository) on paper, beside
torch's ScheduleDualPipeV, in the simulator beside ZB-V, and on real ranks against one process.

On paper (no ranks): our order equals torch's per rank for p = 1..5 and several m (torch's full backward
is our B then W, its overlapped F & B its two sub-actions in order); every schedule validates under
gloo's and NCCL's send semantics; the pairs; the errors. In the simulator: the peak stash (2p + 1
chunk activations against ZB-V's 2p) and the bubble, larger than ZB-V's when chunks carry no
communication of their own, smaller once they do (what the pairs hide). On ranks, ONE launch of 4:
DualPipeV on the whole world (p = 4), on the pp pairs of a dp=2 x pp=2 mesh (p = 2) and on ranks 0-2
(p = 3), and ZB-V beside it; each step's loss, gradients and updated weights against one process
(float32's tolerance, as test_pipeline_ranks.py), and the measured peak stash against the simulator's.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from distlab import launch
from distlab.mesh import layout
from distlab.models import regression_data
from distlab.pipeline.dualpipe_v import (
    check_dualpipev,
    compare_with_zbv,
    dualpipev_order,
    dualpipev_schedule,
    dualpipev_slots,
    pairs,
    steps_on_rank,
    torch_dualpipev_order,
)
from distlab.pipeline.parity import merge, step_parity
from distlab.pipeline.simulate import simulate, timeline_stats
from distlab.pipeline.train import reference_step
from distlab.pipeline.validate import validate

SIZES = [8, 32, 32, 32, 32, 4]  # 9 layers: up to 4 ranks x 2 chunks
CASES = [(p, m) for p in (1, 2, 3, 4) for m in (2 * p, 2 * p + 3)] + [(5, 10)]


def test_our_order_equals_torchs_and_validates() -> None:
    for p, m in CASES:
        assert dualpipev_order(p, m) == torch_dualpipev_order(p, m), (p, m)
        validate(dualpipev_schedule(p, m), "gloo")
    for p, m in ((2, 4), (3, 7), (4, 8)):
        validate(dualpipev_schedule(p, m, rendezvous_safe=True), "nccl")


def test_pairs_and_their_messages() -> None:
    slots = dualpipev_slots(4, 8)
    # the last rank runs its first F0 and B1 apart; every other steady-state round is two pairs
    assert pairs(4, 8) == [5, 6, 7, 7]
    for rank_slots in slots:
        for slot in rank_slots:
            if len(slot) == 3:  # F of one micro-batch and the full backward of another, other chunk
                f, b, w = slot
                assert (f.op, b.op, w.op) == ("F", "B", "W") and f.stage != b.stage
                assert (w.microbatch, w.stage) == (b.microbatch, b.stage)
    # an overlapped pair posts both receives before it and both sends after it
    acts = dualpipev_schedule(4, 8).actions[1]
    ops = [a.op for a in acts]
    i = next(k for k in range(len(ops) - 4) if ops[k:k + 5] == ["recv_fwd", "recv_bwd", "F", "B", "W"])
    assert ops[i + 5:i + 7] == ["send_fwd", "send_bwd"]


def test_simulator_stash_and_bubble_against_zbv() -> None:
    for p, m in ((2, 4), (4, 8), (4, 16)):
        zbv, dpv = compare_with_zbv(p, m)
        assert zbv.peak_stash == (2 * p,) * p and dpv.peak_stash == (2 * p + 1,) * p
        assert dpv.bubble > zbv.bubble  # alone, the V of ZB-V packs tighter
        zbv_c, dpv_c = compare_with_zbv(p, m, t_c=0.5)
        assert dpv_c.makespan < zbv_c.makespan  # once chunks carry communication, the pairs hide it
        assert zbv_c.makespan >= zbv.makespan + 2 * m * 0.5  # ZB-V exposes every chunk's t_c
        stats = timeline_stats(simulate(dualpipev_schedule(p, m), 1.0, 1.0, t_w=1.0), p)
        assert stats.peak_stash == dpv.peak_stash


def test_errors_name_m() -> None:
    with pytest.raises(ValueError, match=r"m=5 micro-batches: DualPipeV needs at least one per stage, "
                                         r"m >= 2p = 6.*use m=6 or more, or 'zbv'"):
        check_dualpipev(3, 5)
    with pytest.raises(ValueError, match=r"m=3 micro-batches"):
        torch_dualpipev_order(2, 3)
    with pytest.raises(ValueError, match=r"p=0 must be a positive integer"):
        dualpipev_schedule(0, 4)


def test_one_process() -> None:
    X, y = regression_data(24, 8, 4, seed=0)
    reference = reference_step(SIZES, X, y)
    for result in steps_on_rank([("dualpipev", 2), ("dualpipev", 3)], SIZES, X, y):
        step_parity(merge([result]), reference).assert_passed()


def _on_four_ranks(X, y) -> dict:
    from distlab.mesh import grid

    rank = dist.get_rank()
    three = dist.new_group([0, 1, 2])
    pp = grid(dp=2, pp=2)["pp"].get_group()
    out = {"p4": steps_on_rank([("dualpipev", 8), ("zbv", 8)], SIZES, X, y),
           "p2": steps_on_rank([("dualpipev", 4), ("dualpipev", 6)], SIZES, X, y, group=pp)}
    if rank < 3:
        out["p3"] = steps_on_rank([("dualpipev", 8)], SIZES, X, y, group=three)
    return out


def test_dualpipev_on_ranks_matches_one_process() -> None:
    X, y = regression_data(24, 8, 4, seed=0)
    reference = reference_step(SIZES, X, y)
    res = launch.run(_on_four_ranks, 4, X, y)
    groups = {"p4": [[0, 1, 2, 3]], "p2": layout(dp=2, pp=2)["pp"], "p3": [[0, 1, 2]]}
    runs = {"p4": [("dualpipev", 8), ("zbv", 8)],
            "p2": [("dualpipev", 4), ("dualpipev", 6)],
            "p3": [("dualpipev", 8)]}
    for key, members in groups.items():
        for ranks in members:
            for k, (name, m) in enumerate(runs[key]):
                results = [res[r][key][k] for r in ranks]
                step_parity(merge(results), reference, label=f"{name} {key} m={m}").assert_passed()
                p = len(ranks)
                stash = tuple(r.run.peak_stash for r in results)
                assert stash == (2 * p + (name == "dualpipev"),) * p, (name, key, m, stash)
