"""The course's timing loops (`distlab.timing`): `time_interleaved`'s calls, order and reduction; the single
contender's loop (`sample_seconds`, `phase_seconds`).

One launch of 2 ranks. No upper bound on a time (the machine is shared): a contender sleeps on one rank
only, so that the slowest rank's time and the mean over ranks have lower bounds that hold under any load.
"""

import time

import pytest
import torch

from distlab import launch
from distlab.timing import median_seconds, phase_seconds, sample_seconds, time_interleaved

NAP = 0.02  # seconds that contender "b" sleeps per call, on rank 1 only


def _timed() -> dict:
    calls: list[str] = []

    def contender(name: str):
        def call() -> None:
            calls.append(name)
            if name == "b" and launch.rank() == 1:
                time.sleep(NAP)
        return call

    contenders = [contender(c) for c in "abc"]
    slowest = time_interleaved(contenders, per_block=2, rounds=3, warmup=1)
    n = len(calls)
    mean = time_interleaved(contenders, per_block=1, rounds=2, warmup=0, over_ranks="mean")
    return {"calls": calls[:n], "max": slowest, "mean": mean}


def test_contenders_are_warmed_up_then_timed_in_blocks_in_rotating_order_with_the_slowest_rank_s_time():
    runs = launch.run(_timed, 2)
    want = list("abc")  # the warm-up, one call each, then the rounds: a b c, b c a, c a b, in blocks of 2
    for first in range(3):
        want += [c for k in range(3) for c in "abc"[(first + k) % 3] * 2]
    for r, got in enumerate(runs):
        assert got["calls"] == want, r
        assert got["max"].shape == (3, 3) and got["max"].dtype == torch.float64, r
        assert torch.equal(got["max"], runs[0]["max"]) and torch.equal(got["mean"], runs[0]["mean"]), r
    slowest, mean = runs[0]["max"], runs[0]["mean"]
    assert (slowest[:, 1] >= NAP).all(), slowest  # rank 1's sleep is the slowest rank's time per call
    assert (mean[:, 1] >= NAP / 2).all(), mean  # half of it on average over the 2 ranks
    assert (slowest >= 0).all() and (mean >= 0).all()


@pytest.mark.parametrize(("settings", "message"), [
    ({"per_block": 0}, r"per_block=0 must be an integer >= 1"),
    ({"rounds": True}, r"rounds=True must be an integer >= 1"),
    ({"warmup": -1}, r"warmup=-1 must be an integer >= 0"),
    ({"over_ranks": "min"}, r"over_ranks='min' is unknown; choose 'max' \(the slowest rank\) or 'mean'"),
])
def test_bad_settings_are_refused_before_any_collective(settings, message):
    with pytest.raises(ValueError, match=message):
        time_interleaved([lambda: None], **{"per_block": 2, "rounds": 3, "warmup": 1, **settings})


# The loop for a single contender: phase_seconds / sample_seconds / median_seconds.


def test_a_single_contender_is_warmed_up_then_timed_call_by_call_with_after_untimed():
    events: list[str] = []

    def fn() -> None:
        events.append("call")
        time.sleep(NAP)

    times = sample_seconds(fn, 3, warmup=2, sync=lambda: events.append("sync"),
                           after=lambda: events.append("after"))
    assert events == ["sync", "call", "sync", "after"] * 5  # 2 warm-up steps, then 3 timed ones
    assert len(times) == 3 and all(t >= NAP for t in times), times
    assert median_seconds(fn, 1, warmup=0) >= NAP


def test_phases_of_a_step_are_timed_apart():
    rows = phase_seconds([lambda: None, lambda: time.sleep(NAP)], 2, warmup=0)
    assert len(rows) == 2 and all(len(r) == 2 and r[0] >= 0 and r[1] >= NAP for r in rows), rows


def _sampled() -> dict:
    def fn() -> None:
        if launch.rank() == 1:
            time.sleep(NAP)

    return {"max": sample_seconds(fn, 2, warmup=1, barrier=True, over_ranks="max"),
            "own": sample_seconds(fn, 2, warmup=0, barrier=True)}


def test_on_ranks_each_call_is_the_slowest_rank_s_or_this_rank_s_own():
    runs = launch.run(_sampled, 2)
    assert runs[0]["max"] == runs[1]["max"] and all(t >= NAP for t in runs[0]["max"]), runs
    assert all(t >= NAP for t in runs[1]["own"]), runs  # rank 1 slept; rank 0's own times need not


@pytest.mark.parametrize(("settings", "message"), [
    ({"repeats": 0}, r"repeats=0 must be an integer >= 1"),
    ({"warmup": -1}, r"warmup=-1 must be an integer >= 0"),
    ({"over_ranks": "min"}, r"over_ranks='min' is unknown"),
])
def test_bad_settings_of_the_single_contender_loop_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        sample_seconds(lambda: None, **{"repeats": 2, **settings})
