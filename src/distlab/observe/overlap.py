"""Overlap of communication with computation, measured from a trace: what was hidden and what was exposed.

For one rank, inside the windows of its profiled steps:
- compute C = the union of its computation spans (main thread on a CPU rank, kernels on a GPU);
- communication M = the union of its collectives' spans (gloo worker threads, NCCL kernels);
- hidden = |M ∩ C|: communication while the rank computed, so it cost no time;
- exposed = |M \\ C|: communication while the rank did nothing else, so the step waited for it;
- idle = |window \\ (C ∪ M)|: neither (Python between operators, waiting for a slower peer's data);
- hidden fraction = hidden / |M|.
These are the quantities Holistic Trace Analysis reports as "communication computation overlap" and its
temporal breakdown (computation, communication, idle; Meta's HTA documentation). The arithmetic is
`intervals`, exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distlab.observe import intervals
from distlab.observe.trace import Span


@dataclass(frozen=True)
class Overlap:
    """One rank's breakdown, in seconds summed over its profiled steps."""

    rank: int
    window: float
    compute: float
    comm: float
    hidden: float
    exposed: float
    idle: float
    comm_spans: int

    @property
    def hidden_fraction(self) -> float:
        """hidden / comm (0 when nothing was communicated)."""
        return self.hidden / self.comm if self.comm > 0 else 0.0


def overlap(rank_spans: Sequence[Span], windows: Sequence[tuple[float, float]] | None = None) -> Overlap:
    """The breakdown of one rank's spans inside `windows` (default: its "step" spans, or else the
    extent of its spans)."""
    _check_one_rank(rank_spans)
    if windows is None:
        windows = _default_windows(rank_spans)
    win = intervals.union(windows)
    comp = intervals.intersection([(s.start, s.end) for s in rank_spans if s.kind == "compute"], win)
    comm_spans = [(s.start, s.end) for s in rank_spans if s.kind == "comm"]
    comm = intervals.intersection(comm_spans, win)
    busy = intervals.union(comp + comm)
    return Overlap(rank_spans[0].rank, intervals.length(win), intervals.length(comp), intervals.length(comm),
                   intervals.length(intervals.intersection(comm, comp)),
                   intervals.length(intervals.difference(comm, comp)),
                   intervals.length(intervals.difference(win, busy)),
                   _started_inside(comm_spans, win))


def _check_one_rank(rank_spans: Sequence[Span]) -> None:
    """Raise ValueError unless `rank_spans` holds spans, all of one rank."""
    if not rank_spans:
        raise ValueError("no spans: pass the spans of one rank's trace (trace.spans)")
    ranks = {s.rank for s in rank_spans}
    if len(ranks) != 1:
        raise ValueError(f"spans of ranks {sorted(ranks)}: pass one rank's spans at a time")


def _default_windows(rank_spans: Sequence[Span]) -> list[tuple[float, float]]:
    """The rank's "step" spans, or else one window from its first span's start to its last span's end."""
    return [(s.start, s.end) for s in rank_spans if s.kind == "step"] or \
        [(min(s.start for s in rank_spans), max(s.end for s in rank_spans))]


def _started_inside(spans: Sequence[tuple[float, float]], windows: Sequence[tuple[float, float]]) -> int:
    """How many of `spans` start inside one of `windows`."""
    return sum(1 for a, _ in spans if any(w0 <= a < w1 for w0, w1 in windows))
