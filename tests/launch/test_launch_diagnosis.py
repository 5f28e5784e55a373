"""The report of a failed run: the rank that caused it, what every rank did, and how fast it comes.

Every failure is provoked with small timeouts, so each test waits a few seconds at most. `within` runs a
launch in a thread, so that a launcher that hangs fails its test instead of hanging the suite."""

from __future__ import annotations

import linecache
import os
import re
import signal
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from distlab import launch


def within(seconds: float, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), which must return or raise within `seconds`."""
    out: dict[str, Any] = {}

    def go() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=go, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"launch.run was still running after {seconds} s"
    out["seconds"] = time.monotonic() - start
    return out


# --- a rank raises ----------------------------------------------------------------------------------

def _raise_on(bad_rank: int) -> None:
    if launch.rank() == bad_rank:
        raise ValueError(f"rank {bad_rank} found a bad value")
    dist.all_reduce(torch.ones(2))  # the others wait for the failed rank and then lose their peer


def test_raising_rank_is_reported_with_its_own_traceback_quickly(capsys):
    start = time.monotonic()
    with pytest.raises(launch.RankError) as info:
        launch.run(_raise_on, 3, 1, timeout=60)
    assert time.monotonic() - start < 20  # far below the 60 s collective timeout
    err = info.value
    assert err.rank == 1
    msg = str(err)
    assert msg.startswith("rank 1 failed with ValueError: rank 1 found a bad value\nWhat each rank did:\n")
    assert "  rank 1: raised ValueError: rank 1 found a bad value, in _raise_on, at " in msg
    assert "(the cause)" in msg
    for r in (0, 2):
        assert re.search(rf"  rank {r}: lost its connection to a peer in all_reduce, at .*"
                         r"dist.all_reduce\(torch.ones\(2\)\).*  \(a consequence\)", msg), msg
    assert "in _raise_on" in err.traceback and 'raise ValueError(f"rank {bad_rank}' in err.traceback
    assert "_worker_main" not in err.traceback  # the launcher's own frame is hidden


# --- a rank dies without an exception while its peers wait in a collective ---------------------------

def _die_in_collective(how: str) -> None:
    if launch.rank() == 1:
        print("rank 1 is about to die", flush=True)
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), getattr(signal, how))
    dist.all_reduce(torch.ones(1))


@pytest.mark.parametrize("how, headline", [
    ("exit", "rank 1 exited with code 3 without raising a Python exception. Something called os._exit"),
    ("SIGKILL", "rank 1 was killed by SIGKILL (signal 9) without raising a Python exception. SIGKILL "
                "cannot be caught, and nothing here says who sent it: a script or a person (kill -9), or "
                "the out-of-memory killer if"),
    ("SIGSEGV", "rank 1 was killed by SIGSEGV (signal 11) without raising a Python exception. SIGSEGV is "
                "a crash in native code"),
])
def test_dead_rank_is_the_cause_and_its_peers_errors_are_consequences(how, headline, capsys):
    out = within(30, launch.run, _die_in_collective, 2, how, timeout=20)
    err = out["error"]
    assert isinstance(err, launch.RankError) and err.rank == 1
    msg = str(err)
    assert msg.startswith(headline), msg
    assert "  rank 1: " in msg and "without raising a Python exception  (the cause)" in msg
    assert re.search(r"  rank 0: lost its connection to a peer in all_reduce, .*\(a consequence\)", msg)
    assert out["seconds"] < 15  # not the 20 s timeout: the peers notice the closed connection at once
    assert "[rank 1] rank 1 is about to die" in capsys.readouterr().out


def _crash_while_peer_sleeps() -> None:
    if launch.rank() == 1:
        os._exit(3)
    time.sleep(60)


def test_dead_rank_while_its_peer_computes_shows_where_the_peer_was():
    start = time.monotonic()
    with pytest.raises(launch.RankError, match="rank 1 exited with code 3 without raising") as info:
        launch.run(_crash_while_peer_sleeps, 2)
    assert time.monotonic() - start < 15
    msg = str(info.value)
    assert re.search(r"  rank 0: still running, in _crash_while_peer_sleeps, at .*time.sleep\(60\)", msg)
    assert "--- where rank 0 was ---" in msg


# --- timeouts and deadlocks ---------------------------------------------------------------------------

def _stall(seconds: float) -> None:
    if launch.rank() == 1:
        time.sleep(seconds)  # never reaches the collective in time
    dist.all_reduce(torch.ones(2))


def test_stalled_rank_is_the_cause_when_its_peer_times_out_waiting_for_it():
    start = time.monotonic()
    with pytest.raises(launch.RankError) as info:
        launch.run(_stall, 2, 120, timeout=2)
    assert time.monotonic() - start < 30
    msg = str(info.value)
    assert info.value.rank == 1  # the rank asleep, not the rank that waited for it (issue 24, item 7)
    assert re.match(r"rank 1 never came to the collective: rank 0 waited more than 2 s for it in all_reduce, "
                    r"at .*dist.all_reduce\(torch.ones\(2\)\), while rank 1 was still running, in _stall, at "
                    r".*time.sleep\(seconds\)", msg), msg
    assert re.search(r"  rank 0: timed out after 2 s in all_reduce, at .*\(a consequence\)", msg)
    assert re.search(r"  rank 1: still running, in _stall, at .*time.sleep\(seconds\)  \(the cause\)", msg)
    assert "--- where rank 1 was ---" in msg and "in _stall" in msg


def _extra_all_reduce() -> None:
    if launch.rank() == 0:
        dist.all_reduce(torch.ones(1))  # only rank 0 calls this one
    dist.barrier()


def test_deadlock_report_shows_where_every_rank_waits():
    out = within(30, launch.run, _extra_all_reduce, 3, timeout=1)
    msg = str(out["error"])
    assert msg.startswith("deadlock: the ranks timed out, waiting more than 1 s for messages that no rank "
                          "sends"), msg
    assert re.search(r"  rank 0: waited in all_reduce, at .*, line \d+: dist.all_reduce\(torch.ones\(1\)\)",
                     msg)
    for r in (1, 2):
        assert re.search(rf"  rank {r}: waited in barrier, at .*, line \d+: dist.barrier\(\)", msg)


# --- a peer returned normally -----------------------------------------------------------------------

def _unmatched_recv() -> None:
    if launch.rank() == 0:
        dist.recv(torch.zeros(1), src=1)  # rank 1 never sends


def test_peer_that_returned_normally_is_not_called_a_crash():
    out = within(30, launch.run, _unmatched_recv, 2, timeout=20)
    msg = str(out["error"])
    assert re.match(r"rank 1 returned normally at \d+\.\d s while rank 0 was still in recv, at .*"
                    r"dist.recv\(torch.zeros\(1\), src=1\)\. A rank waited for a message its peers never "
                    r"send: an unmatched recv", msg), msg
    assert re.search(r"  rank 1: returned normally at \d+\.\d s\n", msg)
    assert "remote worker crashing" not in msg.split("--- traceback")[0]
    assert out["seconds"] < 15


# --- a rank that dies on its way out, after its function returned -------------------------------------

def _groups_then_abort_on_the_way_out() -> int:
    """Both ranks make a subgroup and use it; rank 0 then dies by SIGABRT after its result is written (in
    `worker._exit`), as a native teardown crash would kill it."""
    from distlab.launch import worker

    sub = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(1), group=sub)
    if launch.rank() == 0:
        worker._record_children = lambda d, rank: os.abort()
    return launch.rank()


def test_rank_that_dies_after_returning_is_reported_as_such():
    out = within(60, launch.run, _groups_then_abort_on_the_way_out, 2, timeout=20)
    msg = str(out["error"])
    assert msg.startswith("rank 0 was killed by SIGABRT (signal 6) without raising a Python exception"), msg
    assert "Its function had returned and its result was written; it died while the process ended." in msg
    assert "before the function started" not in msg
    assert re.search(r"  rank 1: returned normally at \d+\.\d s\n", msg), msg


# --- a rank stuck outside communication -------------------------------------------------------------

def _loop_forever_on(stuck_rank: int) -> int:
    if launch.rank() == stuck_rank:
        while True:
            time.sleep(0.1)
    return launch.rank()


def test_rank_stuck_outside_communication_is_ended_after_the_grace_period():
    out = within(40, launch.run, _loop_forever_on, 2, 1, timeout=1)
    err = out["error"]
    assert isinstance(err, launch.RankError) and err.rank == 1
    msg = str(err)
    assert msg.startswith("rank 1 was still running 1 s after rank 0 returned, so the launcher ended the "
                          "run."), msg
    assert re.search(r"  rank 1: still running, in _loop_forever_on, at .*time.sleep\(0.1\)  \(the cause\)",
                     msg)
    assert "--- where rank 1 was ---" in msg and "while True" not in msg.split("---")[0]


def test_stuck_rank_allowed_to_fail_is_ended_and_reported_in_its_slot():
    out = within(40, launch.run, _loop_forever_on, 3, 2, timeout=1, may_fail=[2])
    results = out["value"]
    assert results[:2] == [0, 1]
    assert isinstance(results[2], launch.RankError)
    assert re.match(r"rank 2 was still running 1 s after the other ranks finished, so the launcher ended it "
                    r"\(may_fail allows it to fail\); it was in _loop_forever_on, at .*time.sleep\(0.1\)",
                    str(results[2]))


# --- what a rank's exception is, not what it says ----------------------------------------------------

def _own_timeout() -> None:
    raise TimeoutError("the data loader timed out")


def test_own_exception_that_says_timed_out_is_not_a_launcher_timeout():
    with pytest.raises(launch.RankError) as info:
        launch.run(_own_timeout, 1)
    assert str(info.value).startswith("rank 0 failed with TimeoutError: the data loader timed out\n")


CELL = """\
class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message today")

def cell_fn():
    x = 1
    raise Unprintable()
"""


def test_function_from_a_notebook_cell_shows_its_source_and_unprintable_message():
    name = "/nonexistent/ipykernel_0/1234.py"  # a notebook cell's code has no file on disk
    linecache.cache[name] = (len(CELL), None, CELL.splitlines(True), name)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(CELL, name, "exec"), namespace)
    with pytest.raises(launch.RankError) as info:
        launch.run(namespace["cell_fn"], 1)
    err = info.value
    assert str(err).startswith("rank 0 failed with Unprintable (its message could not be printed: its "
                               "__str__ raised RuntimeError)\n")
    assert f'File "{name}", line 7, in cell_fn\n    raise Unprintable()' in err.traceback
    assert "  rank 0: raised Unprintable (its message could not be printed: its __str__ raised " \
           f"RuntimeError), in cell_fn, at {name}, line 7: raise Unprintable()" in str(err)
