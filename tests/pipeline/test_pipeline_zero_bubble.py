"""Zero-bubble schedules on paper and in one process: ZB-H1 and ZB-V through the validator and the
simulator against the closed forms of `cost_model`, the B/W split against the whole backward (bit for
bit), the errors for bad input, and torch's own orders (ScheduleInterleavedZeroBubble,
ScheduleZBVZeroBubble) set beside ours. Runs no ranks; `test_pipeline_ranks.py` does.
"""

from __future__ import annotations

import pytest
import torch

from distlab.models import regression_data
from distlab.pipeline.actions import Action, Schedule
from distlab.pipeline.communication import DeadlockError, add_communication
from distlab.pipeline.cost_model import predicted_peak_stash, zero_bubble_fraction, zero_bubble_idle
from distlab.pipeline.schedules import make_schedule
from distlab.pipeline.simulate import simulate, timeline_stats
from distlab.pipeline.train import pipeline_step
from distlab.pipeline.validate import validate
from distlab.pipeline.zero_bubble import zb_h1_order, zbv_order

MS = (1, 2, 3, 4, 5, 7, 8, 9)
TIMES = [(1.0, 1.0, 1.0), (1.0, 1.0, 0.5), (1.0, 1.5, 0.7), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 2.0),
         (1.0, 0.5, 1.0), (1.0, 1.3, 1.2)]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_zero_bubble_schedules_are_valid_and_match_the_closed_forms(p: int) -> None:
    for m in MS:
        for name, v in (("zbh1", 1), ("zbv", 2)):
            s = make_schedule(name, p, m, v)
            validate(s, "gloo")
            validate(make_schedule(name, p, m, v, rendezvous_safe=True), "nccl")
            assert s.split_backward
            events = simulate(s, 1.0, 1.0, t_w=1.0)
            stats = timeline_stats(events, p)
            assert stats.peak_stash == predicted_peak_stash(name, p, m, v), (name, m)
            idle = stats.makespan - m * v * 3.0
            if name == "zbv" and m >= 2 * p - 1 or name == "zbh1" and m >= p:
                assert idle == pytest.approx(zero_bubble_idle(name, p, m), abs=1e-9), (name, m)
                assert stats.mean_bubble == pytest.approx(zero_bubble_fraction(name, p, m), abs=1e-12)
        one_f_one_b = timeline_stats(simulate(make_schedule("1f1b", p, max(m, p)), 1.0, 1.0, t_w=1.0), p)
        assert one_f_one_b.makespan - 3 * max(m, p) == pytest.approx(zero_bubble_idle("1f1b", p, m))


@pytest.mark.parametrize("t_f,t_b,t_w", TIMES)
def test_zb_h1_bubble_for_unequal_times_is_the_closed_form(t_f: float, t_b: float, t_w: float) -> None:
    """(p - 1) max(t_f + max(t_b - t_w, 0), t_b) for m >= p; the paper's (p - 1)(t_f + t_b - t_w) when
    t_w <= t_f and t_w <= t_b."""
    for p in (2, 3, 4, 5):
        for m in (p, p + 1, 2 * p, 3 * p + 1):
            stats = timeline_stats(simulate(make_schedule("zbh1", p, m), t_f, t_b, t_w=t_w), p)
            idle = stats.makespan - m * (t_f + t_b + t_w)
            assert idle == pytest.approx(zero_bubble_idle("zbh1", p, m, t_f, t_b, t_w), abs=1e-9), (p, m)
            if t_w <= min(t_f, t_b):
                assert idle == pytest.approx((p - 1) * (t_f + t_b - t_w), abs=1e-9)
            assert idle >= (p - 1) * t_f - 1e-9  # the bound: the last rank waits for its first activation


def test_zero_bubble_beats_1f1b_at_the_same_peak_memory() -> None:
    p, m = 4, 8
    ones = timeline_stats(simulate(make_schedule("1f1b", p, m), 1.0, 1.0, t_w=1.0), p)
    h1 = timeline_stats(simulate(make_schedule("zbh1", p, m), 1.0, 1.0, t_w=1.0), p)
    zbv = timeline_stats(simulate(make_schedule("zbv", p, m, 2), 0.5, 0.5, t_w=0.5), p)
    assert ones.mean_bubble == pytest.approx(3 / 11) and h1.mean_bubble == pytest.approx(3 / 27)
    assert zbv.mean_bubble == pytest.approx(1.5 / 25.5)
    assert max(h1.peak_stash) == max(ones.peak_stash) == p and max(zbv.peak_stash) == 2 * p  # chunks


def test_split_backward_gives_the_same_gradients_bit_for_bit() -> None:
    """B then W computes each weight gradient with the same kernels from the same tensors as the whole
    backward, and adds the microbatches in the same order, so the gradients are equal to the bit."""
    sizes = [8, 16, 16, 16, 4]
    X, y = regression_data(12, 8, 4, seed=0)
    for split, whole in ((("zbh1", 3, 1), ("1f1b", 3, 1)), (("zbv", 4, 2), ("interleaved", 4, 2))):
        a = pipeline_step(sizes, X, y, make_schedule(split[0], 1, split[1], split[2]))
        b = pipeline_step(sizes, X, y, make_schedule(whole[0], 1, whole[1], whole[2]))
        assert a.grads.keys() == b.grads.keys()
        assert all(torch.equal(a.grads[k], b.grads[k]) for k in a.grads), split
        assert a.run.peak_stash_bytes > b.run.peak_stash_bytes  # B's output gradients wait for W


def test_a_tied_weight_inside_one_stage_is_refused_with_a_split_backward() -> None:
    from distlab.models import GPTConfig
    from distlab.pipeline.gpt import gpt_pipeline_step

    config = GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=8)
    idx = torch.zeros(4, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"stage 0: a parameter of shape \(8, 8\) is used by two layers of "
                                         r"this stage \(a tied weight"):
        gpt_pipeline_step(config, idx, idx, make_schedule("zbh1", 1, 2))


def test_bad_zero_bubble_input_names_rank_step_and_rule() -> None:
    good = list(map(list, zb_h1_order(2, 2)))
    w_first = [good[0], [good[1][0], Action("W", 0, 1), *[a for a in good[1][1:] if a != Action("W", 0, 1)]]]
    with pytest.raises(DeadlockError, match=r"rank 1 at action 1 \(W0 of stage 1\) waits for its own B0 of "
                                            r"stage 1, which comes later or never \(W before B\)"):
        add_communication("w first", w_first, 2, 2)
    lists = [list(x) for x in make_schedule("zbh1", 2, 2).actions]
    i, j = (next(k for k, a in enumerate(lists[1]) if (a.op, a.microbatch) == op)
            for op in (("B", 0), ("W", 0)))
    lists[1][i], lists[1][j] = lists[1][j], lists[1][i]
    with pytest.raises(ValueError, match=r"zbh1: rank 1, action \d+ \(W0@s1\): W0 comes before B0 of stage "
                                         r"1; a weight-gradient pass W needs the output gradients its B "
                                         r"computed"):
        validate(Schedule("zbh1", 2, 2, 1, tuple(map(tuple, lists))))
    missing = [good[0], [a for a in good[1] if a != Action("W", 1, 1)]]
    with pytest.raises(ValueError, match=r"W1 of stage 1 runs 0 times \(on rank 1\); a schedule with W "
                                         r"passes splits every backward, so B1 of stage 1 needs its W1"):
        validate(add_communication("missing W", missing, 2, 2))
    too_few = make_schedule("zbv", 2, 4, 2)  # written for m = 4, declared for m = 2
    with pytest.raises(ValueError, match=r"rank 0, action \d+ \(F2@s0\): microbatch must be in 0..1"):
        validate(Schedule("zbv", 2, 2, 2, too_few.actions, "v"))
    with pytest.raises(ValueError, match=r"v=3: 'zbv' places exactly 2 model chunks on each rank, as a V"):
        make_schedule("zbv", 2, 4, 3)
    with pytest.raises(ValueError, match=r"v=2 model chunks per rank only applies to the 'interleaved'"):
        make_schedule("zbh1", 2, 4, 2)
    with pytest.raises(ValueError, match=r"the V placement puts exactly 2 chunks on each rank, not v=3"):
        add_communication("v3", zbv_order(2, 2), 2, 2, 3, placement="v")
    with pytest.raises(ValueError, match=r"rank 0, action 2 \(F0 of stage 3\): stage 3 lives on rank 1 "
                                         r"with p=2, v=2 and the 'loop' placement; a rank runs only the "
                                         r"stages it holds"):
        add_communication("looped V", zbv_order(2, 2), 2, 2, 2)
    with pytest.raises(ValueError, match=r"m=0 microbatches"):
        make_schedule("zbh1", 2, 0)
    with pytest.raises(ValueError, match=r"the closed form of 'zbh1' holds for m >= p"):
        zero_bubble_idle("zbh1", 4, 2)


# ---- measured against torch: its orders built without running them ----------------------------------

TORCH_CASES = [(name, p, m) for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 6, 8) for name in ("zbh1", "zbv")]


@pytest.mark.parametrize("name,p,m", TORCH_CASES)
def test_our_zero_bubble_orders_equal_torchs(name: str, p: int, m: int) -> None:
    from distlab.pipeline.torch_orders import compare_with_torch

    result = compare_with_torch(name, p, m)  # validates and simulates both
    assert result.equal, str(result)
    assert result.bubble_ours == pytest.approx(result.bubble_torch)
    assert result.stash_torch == predicted_peak_stash(name, p, m, 2 if name == "zbv" else 1)


def test_torch_refuses_some_m_that_zb_h1_accepts() -> None:
    from distlab.pipeline.torch_orders import format_torch_order, torch_pipeline_order

    with pytest.raises(ValueError, match=r"refuses m=9 with p=4: m must be a multiple of its number of "
                                         r"rounds"):
        torch_pipeline_order("zbh1", 4, 9)
    validate(make_schedule("zbh1", 4, 9))
    table = format_torch_order(torch_pipeline_order("zbh1", 2, 3))
    assert "Rank 0" in table and "0I0" in table and "1W2" in table


def test_zero_bubble_figure_and_exercise_check() -> None:
    import matplotlib

    matplotlib.use("Agg")
    from distlab.pipeline import figures
    from distlab.pipeline.exercises import ZB_CASES, check_zb_h1_rank

    fig = figures.zero_bubble_figure(3, 5, 1.0, 1.5, 0.5)
    assert len(fig.axes) == 3 and "zbh1" in fig.axes[1].get_title()

    def solution(p, m, r):
        return [(a.op, a.microbatch) for a in zb_h1_order(p, m)[r]]

    report = check_zb_h1_rank(solution)
    assert report and len(report.cases) == len(ZB_CASES)

    def w_right_after_b(p, m, r):
        w = min(p - r - 1, m)
        order = [("F", i) for i in range(w)]
        for i in range(m):
            order += ([("F", w + i)] if w + i < m else []) + [("B", i), ("W", i)]
        return order

    rep = check_zb_h1_rank(w_right_after_b)
    assert not rep and "the bubble grows from 11.1% to 20.0%" in str(rep)
    assert "a W this early delays the F's and B's that other ranks wait for" in str(rep)

    def w_before_b(p, m, r):
        order = solution(p, m, r)
        i, j = order.index(("B", 0)), order.index(("W", 0))
        order[i], order[j] = order[j], order[i]
        return order

    rep = check_zb_h1_rank(w_before_b)
    assert not rep and "W0 comes before B0; W needs the output gradients that its B computes" in str(rep)
    rep = check_zb_h1_rank(lambda p, m, r: solution(p, m, r)[:-1])
    assert not rep and "without its W, a microbatch's weight gradient never reaches .grad" in str(rep)

    def all_w_last(p, m, r):
        return [x for x in solution(p, m, r) if x[0] != "W"] + [("W", i) for i in range(m)]

    rep = check_zb_h1_rank(all_w_last)
    assert not rep and "holds 8 microbatches at once (F done, W not yet); ZB-H1 holds at most" in str(rep)
    assert "a B that comes late keeps the ranks before this one waiting" in str(rep)
