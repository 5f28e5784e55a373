"""Why a launch failed: find the rank whose failure caused the others', and say what every rank did.

When one rank fails, its peers usually fail a moment later with "connection reset by peer" or a
timeout: symptoms, not the cause (`worker.describe` tells them apart by where they come from, also when
they surface through `Work.wait()` or inside a chapter's own error). The launcher gathers one
`RankState` per rank (its exit, its error report, or, for a rank still running, its Python stack) and
`failure` picks the cause in this order:

1. a rank that raised an exception of its own, or died without one (os._exit, even os._exit(0), a
   signal: the out-of-memory killer's SIGKILL, a segfault, gloo's SIGABRT), the earliest first;
2. otherwise, if a rank timed out waiting, a rank still running outside communication (computing,
   asleep) that it waited for;
3. otherwise, if every rank that did not return waits for another, a deadlock (no rank is the cause);
4. otherwise a rank that timed out, or lost its connection, explained by the peer that returned normally.

The report is one `RankError`: a headline naming the cause, one line per rank (what it did and the line
it was at, the cause and its consequences marked), the cause's traceback, and the stacks of the ranks
that were still running or died of a fatal signal. `stuck` reports ranks still running long after a
peer returned, `never_joined` a rank that never came to init_process_group, `past_deadline` a run
that reached its deadline, and `interrupted` where every rank was on Ctrl-C or SIGTERM. What one rank
is (`RankState`) and the line that describes it (`describe_rank`) are `rank_state.py`; `RankError` too.
"""

from __future__ import annotations

from distlab.launch.rank_state import RankError, RankState, _death_report, _raised, describe_rank
from distlab.launch.sources import format_stack, where

__all__ = ["RankError", "RankState", "describe_rank", "ended_allowed", "failure", "interrupted",
           "never_joined", "own_error", "past_deadline", "stuck"]

def _table(states: list[RankState], timeout: float, cause: int | None, deadlock: bool = False) -> str:
    lines = ["What each rank did:"]
    for s in states:
        mark = ""
        if s.rank == cause:
            mark = "  (the cause)"
        elif (s.kind in ("peer", "timeout") or s.communicating) and cause is not None:
            mark = "  (a consequence)"
        elif s.allowed and s.code not in (None, 0):
            mark = "  (allowed by may_fail)"
        lines.append(f"  rank {s.rank}: {describe_rank(s, timeout, deadlock)}{mark}")
    return "\n".join(lines)


def _stacks(states: list[RankState]) -> str:
    parts = [f"\n--- where rank {s.rank} was ---\n{format_stack(s.frames, s.sources) or '(no Python stack)'}"
             for s in states if s.frames and (s.code is None or s.died)]
    return "".join(parts)


def _cause(states: list[RankState]) -> RankState | None:
    """The earliest rank that raised an exception of its own or died without one (not allowed to fail)."""
    causes = [s for s in states if not s.allowed and (s.kind == "raised" or s.died)]
    return min(causes, key=lambda s: s.at, default=None)


def _headline(s: RankState, states: list[RankState], timeout: float) -> str:
    """The first line of the report about the rank chosen as the cause."""
    if s.died:
        return f"{_death_report(s)} Its output, if any, is above."
    e = s.error
    if e["kind"] == "raised":
        return f"rank {s.rank} failed with {_raised(e)}"
    if e["kind"] == "timeout":
        return (f"rank {s.rank} timed out: it waited more than {timeout:g} s in {e['where']} for a message "
                "from another rank (run(timeout=...) sets this limit)")
    done = [q for q in states if q.returned]
    if not done:
        return f"rank {s.rank} lost its connection to a peer in {e['where']}"
    q = min(done, key=lambda q: q.at)
    at = f" at {q.ended:.1f} s" if q.ended is not None else ""
    return (f"rank {q.rank} returned normally{at} while rank {s.rank} was still in {e['where']}. A rank "
            "waited for a message its peers never send: an unmatched recv, an extra collective, or "
            "collectives that differ across ranks (operation, size or dtype)")


def _waiting(s: RankState) -> bool:
    return s.kind in ("timeout", "peer") or s.communicating


def _deadlocked(states: list[RankState]) -> bool:
    """Every rank that did not return waits for another (it timed out, lost the peer that did, or still
    waits in a collective), and at least one timed out."""
    mine = [s for s in states if not s.allowed and s.kind != "returned"]
    return all(_waiting(s) for s in mine) and any(s.kind == "timeout" for s in mine)


def _absent(states: list[RankState]) -> RankState | None:
    """A rank the others timed out waiting for, that was still running outside communication (or had not
    even reached init_process_group)."""
    mine = [s for s in states if not s.allowed]
    if not any(s.kind == "timeout" for s in mine):
        return None
    away = [s for s in mine if s.code is None and not s.communicating]
    return min(away, key=lambda s: (s.joined, s.rank), default=None)


def never_joined(states: list[RankState], grace: float) -> RankError:
    """The report of a rank that never came to init_process_group while the others waited there."""
    s = min((q for q in states if not q.joined and q.code is None), key=lambda q: q.rank)
    waiting = [q.rank for q in states if q.joined]
    who = f"rank {waiting[0]}" if len(waiting) == 1 else f"ranks {waiting}"
    at = f", in {where(s.frames, s.sources)}" if s.frames else ""
    head = (f"rank {s.rank} never joined the process group: {who} waited more than {grace:g} s for it at "
            f"init_process_group, while rank {s.rank} was still loading the function and its arguments{at} "
            "(the modules they need are imported then)")
    return RankError(f"{head}\n{_table(states, grace, s.rank)}{_stacks(states)}", s.rank)


def _absent_headline(s: RankState, states: list[RankState], timeout: float) -> str:
    w = min((q for q in states if q.kind == "timeout"), key=lambda q: q.at)
    return (f"rank {s.rank} never came to the collective: rank {w.rank} waited more than {timeout:g} s "
            f"for it in {w.error['where']}, while rank {s.rank} was still running, in "
            f"{where(s.frames, s.sources)}. "
            "A long computation, a sleep or an endless loop outside communication keeps the others waiting "
            "(run(timeout=...) sets how long they wait)")


def _deadlock(states: list[RankState], timeout: float) -> RankError:
    s = min((q for q in states if not q.allowed and q.kind == "timeout"), key=lambda q: q.rank)
    if not any(q.started for q in states):
        head = (f"the ranks did not all join the process group within timeout={timeout:g} s: starting "
                f"{len(states)} processes took longer than that on this machine; use a larger timeout")
    else:
        head = (f"deadlock: the ranks timed out, waiting more than {timeout:g} s for messages that no rank "
                "sends. Compare where they wait: every send needs a matching recv, and every rank must call "
                "the same collectives in the same order, with the same sizes and dtypes")
    table = _table(states, timeout, None, deadlock=True)
    return RankError(f"{head}\n{table}", s.rank, s.error["traceback"])


def failure(states: list[RankState], timeout: float) -> RankError:
    """The report of a run in which a rank that was not allowed to fail did."""
    s = _cause(states) or _absent(states)
    if s is None and _deadlocked(states):
        return _deadlock(states, timeout)
    failed = [q for q in states if not q.allowed and q.error is not None]
    if s is None:
        order = {"timeout": 0, "peer": 1}
        s = min(failed, key=lambda q: (order.get(q.kind, 2), q.at))
    head = _absent_headline(s, states, timeout) if s.code is None else _headline(s, states, timeout)
    tb = s.error["traceback"] if s.error else ""
    text = f"{head}\n{_table(states, timeout, None if s.kind == 'peer' else s.rank)}"
    if tb:
        text += f"\n\n--- traceback of rank {s.rank} ---\n{tb.rstrip()}"
    return RankError(text + _stacks(states), s.rank, tb)


def stuck(states: list[RankState], grace: float, timeout: float) -> RankError:
    """The report of ranks still running `grace` seconds after the first rank returned."""
    first = min((s for s in states if s.returned), key=lambda s: s.at)
    ranks = [s.rank for s in states if s.code is None and not s.allowed] or [
        s.rank for s in states if s.code is None]
    who = f"rank {ranks[0]} was" if len(ranks) == 1 else f"ranks {ranks} were"
    head = (f"{who} still running {grace:g} s after rank {first.rank} returned, so the launcher ended the "
            "run. A rank stuck outside communication (an endless loop, a long sleep, waiting for "
            "something that never comes) is bounded by this grace period, not by a collective's "
            "timeout; run(timeout=...) sets both")
    return RankError(f"{head}\n{_table(states, timeout, ranks[0])}{_stacks(states)}", ranks[0])


def past_deadline(states: list[RankState], limit: str, timeout: float) -> RankError:
    """The report of a run still going at its deadline: where every running rank was."""
    running = [s for s in states if s.code is None and not s.allowed]
    s = min(running, key=lambda q: (q.joined, q.communicating, q.rank))
    ranks = [q.rank for q in running]
    who = f"rank {ranks[0]} was" if len(ranks) == 1 else f"ranks {ranks} were"
    outside = [q.rank for q in running if not q.communicating]
    why = ("none of them in communication: an endless loop, or a computation longer than the deadline"
           if len(outside) == len(running) else
           f"{'rank' if len(outside) == 1 else 'ranks'} {outside if len(outside) > 1 else outside[0]} "
           "outside communication" if outside else "all of them waiting in communication")
    head = (f"{who} still running when the run reached {limit}, so the launcher ended it ({why}); "
            "run(deadline=...) sets how long the function may run. Every running rank's stack is below")
    return RankError(f"{head}\n{_table(states, timeout, s.rank)}{_stacks(states)}", s.rank)


def ended_allowed(s: RankState, why: str) -> RankError:
    """The slot of a rank allowed to fail (may_fail) that was still running when the others were done."""
    return RankError(f"rank {s.rank} was still running {why}, so the launcher ended it (may_fail allows it "
                     f"to fail); it was in {where(s.frames, s.sources)}", s.rank)


def own_error(s: RankState) -> RankError:
    """Rank s's failure on its own, for a rank that `run(may_fail=...)` allows to fail."""
    if s.error is not None:
        return RankError(f"rank {s.rank} failed with {_raised(s.error)}", s.rank, s.error["traceback"])
    return RankError(_death_report(s), s.rank)


def interrupted(states: list[RankState], timeout: float, how: str = "interrupted") -> str:
    """Where every rank was when the run was interrupted (Ctrl-C, the kernel's interrupt button, SIGTERM)."""
    if not states:
        return f"launch.run was {how} before any rank had started."
    return f"launch.run was {how}.\n{_table(states, timeout, None)}{_stacks(states)}"
