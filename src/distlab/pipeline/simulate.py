"""Run a schedule on paper: the timeline it would have, given how long each action takes.

The simulator reads the same `Schedule` data that the executor runs, so its timeline is the *ideal* one
for that schedule: compute takes exactly t_f or t_b, messages take t_comm, and nothing else happens.
`timeline_stats` measures a timeline (simulated or measured on real ranks) the same way: the bubble
(idle fraction of each rank) and the peak number of stashed microbatches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from distlab.pipeline.actions import COMPUTE, Action, Schedule, message_key
from distlab.pipeline.communication import DeadlockError


@dataclass(frozen=True)
class Event:
    """One action of one rank, placed in time (seconds, or any unit the times were given in)."""

    rank: int
    action: Action
    start: float
    end: float


def simulate(schedule: Schedule, t_f: float = 1.0, t_b: float = 2.0, t_comm: float = 0.0,
             rendezvous: bool = False, t_w: float = 0.0,
             duration: Callable[[int, Action], float] | None = None) -> list[Event]:
    """The timeline of `schedule` when a forward of one stage on one microbatch takes t_f, a backward
    t_b and a message t_comm.

    A zero-bubble schedule splits the backward into B (the input gradient, t_b) and W (the weight
    gradient, t_w; Qi et al. 2023). A schedule without W runs both halves in its B, which then takes
    t_b + t_w: so one (t_f, t_b, t_w) describes one model for every schedule, and the default t_w = 0
    keeps t_b the whole backward.

    As the executor does, a rank posts each run of consecutive sends and receives together, then waits
    until the run's receives are complete (a receive completes t_comm after both its send and itself are
    posted). Sends are *buffered* by default: the sender does not wait for them, as with gloo. With
    rendezvous=True a rank also waits until its sends have been received, the strictest semantics (NCCL
    with large messages); a schedule that finishes under it cannot deadlock on any backend.
    A schedule that cannot finish raises `DeadlockError`.
    duration: if given, the time of each compute action, `duration(rank, action)`, instead of the
    per-op times (DualPipeV's overlapped pairs take less than their parts; `dualpipe_v`).
    With v chunks per rank, t_f and t_b are per chunk: pass (whole-rank time) / v to compare schedules
    on the same model.
    """
    durations = {"F": t_f, "B": t_b if schedule.split_backward else t_b + t_w, "W": t_w}
    sim = _Simulation(schedule, durations, t_comm, rendezvous, duration)
    while not sim.finished():
        if not any([sim.advance(r) for r in range(schedule.p)]):
            stuck = {r: str(a) for r, a in sim.next_actions().items()}
            how = "rendezvous" if rendezvous else "buffered"
            raise DeadlockError(f"{schedule.name} deadlocks with {how} sends; ranks stuck at {stuck}")
    return sorted(sim.events, key=lambda e: (e.rank, e.start, e.end))


class _Simulation:
    """The state of a simulated step: each rank's clock and position in its list, and when each side of
    each message was posted. `durations[op]` is the time of a compute op (one row per kind of compute)."""

    def __init__(self, schedule: Schedule, durations: dict[str, float], t_comm: float,
                 rendezvous: bool, duration: Callable[[int, Action], float] | None = None) -> None:
        self.acts, self.durations, self.duration = schedule.actions, durations, duration
        self.t_comm, self.rendezvous = t_comm, rendezvous
        self.clock = [0.0] * schedule.p
        self.pos = [0] * schedule.p
        self.run_posted = [False] * schedule.p
        self.posted: dict[tuple[str, str, int, int], float] = {}  # ("send"|"recv", *message_key) -> time
        self.events: list[Event] = []

    def finished(self) -> bool:
        return all(pos == len(acts) for pos, acts in zip(self.pos, self.acts, strict=True))

    def next_actions(self) -> dict[int, Action]:
        return {r: acts[self.pos[r]] for r, acts in enumerate(self.acts) if self.pos[r] < len(acts)}

    def advance(self, r: int) -> bool:
        """Run rank r as far as it can go without waiting for a peer; return whether it moved (posting a
        run of messages counts: a peer may be waiting for it)."""
        moved = False
        while self.pos[r] < len(self.acts[r]):
            a = self.acts[r][self.pos[r]]
            if a.op in COMPUTE:
                self._compute(r, a)
            else:
                moved |= self._post(r)
                if not self._complete(r):
                    return moved
            moved = True
        return moved

    def _compute(self, r: int, a: Action) -> None:
        end = self.clock[r] + (self.durations[a.op] if self.duration is None else self.duration(r, a))
        self.events.append(Event(r, a, self.clock[r], end))
        self.clock[r] = end
        self.pos[r] += 1

    def _run(self, r: int) -> list[Action]:
        """Rank r's current run of consecutive sends and receives."""
        q = self.pos[r]
        while q < len(self.acts[r]) and self.acts[r][q].op not in COMPUTE:
            q += 1
        return list(self.acts[r][self.pos[r]:q])

    def _end_of(self, b: Action) -> float | None:
        """When message action `b` completes, or None while its peer has not posted its side."""
        key = message_key(b)
        mine = self.posted[(b.op[:4], *key)]
        if b.op.startswith("send") and not self.rendezvous:
            return mine  # a buffered send completes as soon as it is posted
        other = self.posted.get(("recv" if b.op.startswith("send") else "send", *key))
        return None if other is None else max(mine, other) + self.t_comm

    def _post(self, r: int) -> bool:
        """Post rank r's current run of messages, unless it is already posted; return whether it posted."""
        if self.run_posted[r]:
            return False
        for b in self._run(r):
            self.posted[(b.op[:4], *message_key(b))] = self.clock[r]
        self.run_posted[r] = True
        return True

    def _complete(self, r: int) -> bool:
        """Complete rank r's posted run if every peer has posted its side; return whether it did."""
        run = self._run(r)
        ends = [self._end_of(b) for b in run]
        if any(end is None for end in ends):
            return False  # wait for a peer to post its side
        for b, end in zip(run, ends, strict=True):
            self.events.append(Event(r, b, self.posted[(b.op[:4], *message_key(b))], end))
        self.clock[r] = max([self.clock[r], *ends])
        self.pos[r] += len(run)
        self.run_posted[r] = False
        return True


@dataclass(frozen=True)
class TimelineStats:
    """What a timeline says: its length, each rank's busy time and bubble, and the peak stash."""

    makespan: float
    busy: tuple[float, ...]  # per rank, time in F, B and W
    bubble: tuple[float, ...]  # per rank, 1 - busy / makespan
    peak_stash: tuple[int, ...]  # per rank, most (microbatch, stage) pairs between their F and B (or W)

    @property
    def mean_bubble(self) -> float:
        return sum(self.bubble) / len(self.bubble)


def peak_stash(actions: Sequence[Action]) -> int:
    """The most (microbatch, stage) pairs whose F has run and whose activations are not yet freed, along
    one rank's list: how many microbatches' activations that rank holds at its worst moment.

    The backward frees them: B when it is whole, W when the backward is split, since W still reads the
    inputs of the stage's layers (and B's output gradients) that the stash holds (Qi et al. 2023).
    """
    frees = "W" if any(a.op == "W" for a in actions) else "B"
    live = peak = 0
    for a in actions:
        if a.op == "F":
            live += 1
            peak = max(peak, live)
        elif a.op == frees:
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
