"""The right rank is blamed, however the failure surfaces, and no run outlives its deadline.

Each test is one small launch with tiny timeouts (issue 24, items 5-8): an error that reaches the
victims through `Work.wait()` (irecv().wait(), as chapter code waits), a rank that calls os._exit(0), a
rank that gloo aborts (SIGABRT on a size mismatch), a rank stuck before init_process_group, a deadlock
through irecv().wait(), and ranks that all loop outside communication. The report of a rank asleep while
its peers wait in a collective is tested in test_launch_diagnosis.py (`test_stalled_rank_...`)."""

from __future__ import annotations

import os
import re
import time

import torch
import torch.distributed as dist

from distlab import launch
from distlab.collectives import ring_all_reduce
from tests.launch.test_launch_diagnosis import within


def _irecv_from_a_rank_that_exits() -> None:
    if launch.rank() == 1:
        os._exit(0)  # leaves without a result and without an exception
    if launch.rank() == 2:
        ring_all_reduce(torch.ones(4))  # chapter 1's ring: its error comes out of Work.wait() in p2p.py
    dist.irecv(torch.zeros(1), src=1).wait()  # the error comes out of Work.wait(), in this frame


def test_rank_that_exits_is_blamed_when_its_peers_fail_in_work_wait():
    out = within(60, launch.run, _irecv_from_a_rank_that_exits, 3, timeout=20)
    err = out["error"]
    assert isinstance(err, launch.RankError) and err.rank == 1, str(err)
    msg = str(err)
    assert msg.startswith("rank 1 exited with code 0 without raising a Python exception. Something called "
                          "os._exit(0) before the function returned"), msg
    assert re.search(r"  rank 0: lost its connection to a peer in _irecv_from_a_rank_that_exits, at .*line "
                     r"\d+: dist.irecv\(torch.zeros\(1\), src=1\).wait\(\)  \(a consequence\)", msg), msg
    assert "  rank 1: exited with code 0 without raising a Python exception  (the cause)" in msg
    # Rank 2 learns of the loss either when it posts its irecv (the connection is already closed) or
    # when it waits on it: which one is a race with rank 1's exit, and both are inside chapter 1's p2p.py.
    assert re.search(r"  rank 2: lost its connection to a peer in (sendrecv|irecv), at .*p2p.py, line \d+: "
                     r"(work.wait\(\)|return dist.irecv\(.*\))  \(a consequence\)", msg), msg


def _mismatched_sizes() -> None:
    if launch.rank() == 0:
        dist.isend(torch.zeros(4), dst=1).wait()
    else:
        dist.irecv(torch.zeros(3), src=0).wait()  # gloo aborts this process: 16 bytes arrive for 12
    dist.barrier()


def test_rank_that_gloo_aborts_is_the_cause_with_what_gloo_said_and_where_it_was():
    out = within(60, launch.run, _mismatched_sizes, 2, timeout=20)
    err = out["error"]
    msg = str(err)
    assert isinstance(err, launch.RankError) and err.rank == 1, msg
    assert msg.startswith("rank 1 was killed by SIGABRT (signal 6) without raising a Python exception. "
                          "SIGABRT means native code aborted"), msg
    assert "Native code said: " in msg and "Received data size doesn't match expected size" in msg
    assert re.search(r"The rank was in _mismatched_sizes, at .*line \d+: dist.irecv\(torch.zeros\(3\), "
                     r"src=0\).wait\(\)", msg), msg
    assert "  rank 1: was killed by SIGABRT (signal 6) without raising a Python exception  (the cause)" in msg
    assert re.search(r"  rank 0: .*\(a consequence\)", msg), msg


def _irecv_from_each_other() -> None:
    dist.irecv(torch.zeros(1), src=1 - launch.rank()).wait()  # both wait; nobody sends


def test_deadlock_through_work_wait_shows_where_every_rank_waits():
    msg = str(within(60, launch.run, _irecv_from_each_other, 2, timeout=1)["error"])
    assert msg.startswith("deadlock: the ranks timed out, waiting more than 1 s for messages that no rank "
                          "sends"), msg
    for r in (0, 1):
        assert re.search(rf"  rank {r}: waited in _irecv_from_each_other, at .*line \d+: "
                         r"dist.irecv\(torch.zeros\(1\), src=1 - launch.rank\(\)\).wait\(\)", msg), msg
    assert "Timed out" not in msg.split("\n")[0]


class _SlowToLoad:
    """An argument whose unpickling, on rank 1 only, never ends (as an import that hangs would)."""

    def __reduce__(self) -> tuple:
        return _load, ()


def _load() -> None:
    if os.environ.get("RANK") == "1":
        time.sleep(120)


def _takes(arg: object) -> int:
    return launch.rank()


def test_rank_stuck_before_init_process_group_is_blamed():
    out = within(90, launch.run, _takes, 2, _SlowToLoad(), timeout=1)  # waits LOADING = 10 s
    err = out["error"]
    msg = str(err)
    assert isinstance(err, launch.RankError) and err.rank == 1, msg
    assert re.match(r"rank 1 never joined the process group: rank 0 waited more than 10 s for it at "
                    r"init_process_group, while rank 1 was still loading the function and its arguments, in "
                    r"_load, at .*time.sleep\(120\)", msg), msg
    assert "in in " not in msg
    assert re.search(r"  rank 1: still starting: it had not reached init_process_group, in _load, .*"
                     r"\(the cause\)", msg), msg
    assert "--- where rank 1 was ---" in msg


def _loop_everywhere() -> None:
    while True:
        time.sleep(0.1)  # every rank, outside communication: no collective times out


def test_run_ends_at_its_deadline_with_every_rank_stack_when_all_ranks_loop():
    out = within(60, launch.run, _loop_everywhere, 2, timeout=1, deadline=2)
    err = out["error"]
    msg = str(err)
    assert isinstance(err, launch.RankError) and err.rank == 0, msg
    assert msg.startswith("ranks [0, 1] were still running when the run reached its deadline of 2 s, so the "
                          "launcher ended it (none of them in communication"), msg
    for r in (0, 1):
        assert re.search(rf"  rank {r}: still running, in _loop_everywhere, at .*time.sleep\(0.1\)", msg), msg
        assert f"--- where rank {r} was ---" in msg
