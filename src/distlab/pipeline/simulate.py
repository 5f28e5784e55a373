"""Run a schedule on paper: the timeline it would have, given how long each action takes.

The simulator reads the same `Schedule` data that the executor runs, so its timeline is the *ideal* one
for that schedule: compute takes exactly t_f or t_b, messages take t_comm, and nothing else happens.
`timeline_stats` measures a timeline (simulated or measured on real ranks) the same way: the bubble
(idle fraction of each rank) and the peak number of stashed microbatches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distlab.pipeline.actions import COMPUTE, Action, Schedule
from distlab.pipeline.communication import DeadlockError


@dataclass(frozen=True)
class Event:
    """One action of one rank, placed in time (seconds, or any unit the times were given in)."""

    rank: int
    action: Action
    start: float
    end: float


def message_key(a: Action) -> tuple[str, int, int]:
    """The message a send or receive moves: (direction, microbatch, stage that produced it)."""
    kind = a.op.split("_")[1]
    if a.op.startswith("send"):
        return kind, a.microbatch, a.stage
    return kind, a.microbatch, a.stage - 1 if kind == "fwd" else a.stage + 1


def simulate(schedule: Schedule, t_f: float = 1.0, t_b: float = 2.0, t_comm: float = 0.0,
             rendezvous: bool = False) -> list[Event]:
    """The timeline of `schedule` when a forward of one stage on one microbatch takes t_f, a backward
    t_b and a message t_comm.

    As the executor does, a rank posts each run of consecutive sends and receives together, then waits
    until the run's receives are complete (a receive completes t_comm after both its send and itself are
    posted). Sends are *buffered* by default: the sender does not wait for them, as with gloo. With
    rendezvous=True a rank also waits until its sends have been received, the strictest semantics (NCCL
    with large messages); a schedule that finishes under it cannot deadlock on any backend.
    A schedule that cannot finish raises `DeadlockError`.
    With v chunks per rank, t_f and t_b are per chunk: pass (whole-rank time) / v to compare schedules
    on the same model.
    """
    p, acts = schedule.p, schedule.actions
    clock = [0.0] * p
    pos = [0] * p
    posted: dict[tuple[str, str, int, int], float] = {}  # ("send"|"recv", *message_key) -> post time
    run_posted = [False] * p
    events: list[Event] = []
    while any(pos[r] < len(acts[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while pos[r] < len(acts[r]):
                a = acts[r][pos[r]]
                if a.op in COMPUTE:
                    end = clock[r] + (t_f if a.op == "F" else t_b)
                    events.append(Event(r, a, clock[r], end))
                    clock[r], pos[r], progressed = end, pos[r] + 1, True
                    continue
                q = pos[r]
                while q < len(acts[r]) and acts[r][q].op not in COMPUTE:
                    q += 1
                run = acts[r][pos[r]:q]
                if not run_posted[r]:
                    for b in run:
                        posted[(b.op[:4], *message_key(b))] = clock[r]
                    run_posted[r], progressed = True, True
                ends = []
                for b in run:
                    mine = posted[(b.op[:4], *message_key(b))]
                    other = posted.get(("recv" if b.op.startswith("send") else "send", *message_key(b)))
                    if b.op.startswith("send") and not rendezvous:
                        ends.append(mine)
                    elif other is None:
                        break
                    else:
                        ends.append(max(mine, other) + t_comm)
                if len(ends) < len(run):
                    break  # wait for a peer to post its side
                for b, end in zip(run, ends, strict=True):
                    events.append(Event(r, b, posted[(b.op[:4], *message_key(b))], end))
                clock[r] = max([clock[r], *ends])
                pos[r], run_posted[r], progressed = q, False, True
        if not progressed:
            stuck = {r: str(acts[r][pos[r]]) for r in range(p) if pos[r] < len(acts[r])}
            how = "rendezvous" if rendezvous else "buffered"
            raise DeadlockError(f"{schedule.name} deadlocks with {how} sends; ranks stuck at {stuck}")
    return sorted(events, key=lambda e: (e.rank, e.start, e.end))


@dataclass(frozen=True)
class TimelineStats:
    """What a timeline says: its length, each rank's busy time and bubble, and the peak stash."""

    makespan: float
    busy: tuple[float, ...]  # per rank, time in F and B
    bubble: tuple[float, ...]  # per rank, 1 - busy / makespan
    peak_stash: tuple[int, ...]  # per rank, most (microbatch, stage) pairs between their F and B

    @property
    def mean_bubble(self) -> float:
        return sum(self.bubble) / len(self.bubble)


def peak_stash(actions: Sequence[Action]) -> int:
    """The most (microbatch, stage) pairs whose F has run and whose B has not, along one rank's list:
    how many microbatches' activations that rank holds at its worst moment."""
    live = peak = 0
    for a in actions:
        if a.op == "F":
            live += 1
            peak = max(peak, live)
        elif a.op == "B":
            live -= 1
    return peak


def timeline_stats(events: Sequence[Event], p: int) -> TimelineStats:
    """Makespan, busy time and bubble per rank, and peak stash per rank, of a timeline."""
    start = min(e.start for e in events)
    makespan = max(e.end for e in events) - start
    busy = [0.0] * p
    per_rank: list[list[Action]] = [[] for _ in range(p)]
    for e in sorted(events, key=lambda e: (e.rank, e.start, e.end)):
        per_rank[e.rank].append(e.action)
        if e.action.op in COMPUTE:
            busy[e.rank] += e.end - e.start
    bubble = tuple(1.0 - b / makespan if makespan > 0 else 0.0 for b in busy)
    return TimelineStats(makespan, tuple(busy), bubble, tuple(peak_stash(a) for a in per_rank))
