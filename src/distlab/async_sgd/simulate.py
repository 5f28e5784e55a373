"""A parameter server simulated in time: who computes when, under sync, SSP and async, with stragglers.

The real server (`parameter_server.py`) depends on the machine's timing; this event simulation runs the
same admission rule (`ssp.may_start`) on a clock of its own, with fixed step times per worker, so it
gives the same answer on every machine. The book's schedule and staleness figures are drawn from it;
the exercise check runs a student's admission rule through it.

Each worker w computes for `step_times[w - 1]` seconds per gradient; pushes are applied at once
(sync: the average of a whole round is applied when its last gradient arrives), and a worker asks for
parameters again right after its push, receiving them when the rule admits it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from distlab.async_sgd.ssp import MODES, check_staleness, may_start

Rule = Callable[[int, Sequence[int], float], bool]


class Step(NamedTuple):
    """One gradient in the simulation: worker, its clock, compute interval, and the versions it was read
    at and applied to (staleness = applied - read; a sync round is applied to the version it read)."""

    worker: int
    clock: int
    start: float
    end: float
    read_version: int
    applied_version: int

    @property
    def staleness(self) -> int:
        return self.applied_version - self.read_version


class Deadlock(RuntimeError):
    """Every live worker waits for admission and none computes: the rule never lets anyone go on."""


def _threshold(mode: str, step_times: Sequence[float], staleness: int | float) -> int | float:
    """The SSP threshold of `mode` (0 sync, `staleness` ssp, infinity async), after checking the run."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; choose one of {', '.join(MODES)}")
    if not step_times or any(t <= 0 for t in step_times):
        raise ValueError(f"step_times={list(step_times)} must hold one positive time per worker")
    return {"sync": 0, "ssp": check_staleness(staleness), "async": math.inf}[mode]


def _land(mode: str, W: int, out: list[Step], pending: list, version: int,
          gradient: tuple[int, int, float, int], now: float) -> int:
    """A gradient reaches the server at `now`: applied at once (ssp, async), or with the round's others
    once all W are in (sync). Appends the applied Steps to `out`; returns the new version."""
    w, clock, start, read = gradient
    if mode != "sync":
        out.append(Step(w + 1, clock, start, now, read, version))
        return version + 1
    pending.append(gradient)
    if len(pending) < W:
        return version
    out += [Step(u + 1, c, s, now, r, version) for u, c, s, r in pending]
    pending.clear()
    return version + 1


def simulate(mode: str, step_times: Sequence[float], steps: int, staleness: int | float = math.inf,
             rule: Rule = may_start) -> list[Step]:
    """Every gradient of a run (Step records, by end time), stopped as the real server stops: sync after
    `steps` rounds, the others once steps x W gradients are applied (gradients in flight still land).

    `rule(clock, clocks, threshold)` decides admission (default: SSP's `may_start`), with threshold 0
    for sync, `staleness` for ssp, and infinity for async."""
    threshold = _threshold(mode, step_times, staleness)
    W = len(step_times)
    clocks = [0] * W
    version, out, pending, budget = 0, [], [], steps * W
    running: list[tuple[float, int, int, float, int]] = []  # heap of (end, worker, clock, start, read)
    waiting = list(range(W))
    now = 0.0
    while True:
        done = version >= steps if mode == "sync" else len(out) >= budget
        if done:
            waiting = []
        for w in list(waiting):  # admit, in worker order, everyone the rule lets go
            if rule(clocks[w], list(clocks), threshold):
                waiting.remove(w)
                heapq.heappush(running, (now + step_times[w], w, clocks[w], now, version))
        if not running:
            if waiting:
                raise Deadlock(f"at t={now:g} workers {[w + 1 for w in waiting]} wait with clocks "
                               f"{clocks} and none is computing: the rule admits no one")
            return out
        now, w, clock, start, read = heapq.heappop(running)
        clocks[w] += 1
        version = _land(mode, W, out, pending, version, (w, clock, start, read), now)
        waiting.append(w)
