"""Overlap measured from traces, for chapter 2's strategies, beside chapter 2's own timeline and count.

`measure_overlap` (in the launching process) runs each variant on `world_size` ranks
(`profiled.profile_data_parallel`), reads every rank's trace (`trace.spans`), computes its breakdown
(`overlap.overlap`), merges the ranks' traces into one file per variant (`trace.merge_files`), and
returns one `OverlapRow` per variant and rank. `checks` states what must hold between the trace and the
chapter's own measurements of the same steps:

- the same number of all-reduces in the trace, in `comm_log` and in chapter 2's `StepTimeline` (exact);
- the trace's communication lies inside the timeline's: the timeline times each all-reduce from its
  launch to the callback that notes its end, the trace from when a gloo worker takes it to its end, so
  trace <= timeline, within `SLACK` (the two clocks' granularity and the callback's delay);
- hidden in backward: the timeline calls an all-reduce hidden while it is in flight during backward, the
  trace only while an operator runs beside it; inside the backward passes (the trace's `distlab:backward`
  ranges, which lie inside the timeline's), the trace's hidden seconds are at most the timeline's (within
  `SLACK`). On a shared CPU the gap is the time the rank's main thread ran no operator (Python between
  operators, or waiting for a core); on a GPU the two come closer.
  The whole step's hidden shares are not ordered: after backward, an all-reduce still in flight while
  the main thread copies an earlier bucket back or steps the optimizer is hidden in the trace and exposed
  in the timeline (which counts from backward's end to the optimizer step as waiting), so on a loaded
  machine the trace's share can be the larger.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distlab import launch
from distlab.collectives.cost_model import MachineParams
from distlab.observe.overlap import Overlap, overlap
from distlab.observe.profiled import profile_data_parallel
from distlab.observe.trace import Span, merge_files, spans

VARIANTS = (("per_parameter", 1), ("bucketed", 1), ("overlapped", 1), ("overlapped", 4))
SLACK = 0.05  # relative slack of the inequalities of `checks` (each also allows 1 ms per step)


@dataclass(frozen=True)
class OverlapRow:
    """One variant on one rank: the trace's breakdown (the whole steps, and the hidden seconds inside
    the backward passes), the timeline's, the counts, the step spans."""

    strategy: str
    accumulate: int
    trace: Overlap
    trace_hidden_in_backward: float
    timeline_comm: float
    timeline_hidden: float
    timeline_exposed: float
    timeline_calls: int
    comm_log_calls: int
    steps: int
    backward: float
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    @property
    def label(self) -> str:
        return self.strategy + (f", no_sync x{self.accumulate}" if self.accumulate > 1 else "")

    @property
    def timeline_hidden_fraction(self) -> float:
        return self.timeline_hidden / self.timeline_comm if self.timeline_comm > 0 else 0.0


def _hidden_in_backward(rank_spans: list[Span]) -> float:
    """Seconds of communication hidden behind computation inside the rank's `distlab:backward` ranges."""
    backward = [(s.start, s.end) for s in rank_spans if s.kind == "backward"]
    return overlap(rank_spans, backward).hidden if backward else 0.0


def _row(strategy: str, accumulate: int, out: dict, rank_spans: list[Span]) -> OverlapRow:
    tls = out["timelines"]
    sizes = tuple(n for t in tls for n in t.nbytes)
    secs = tuple(b - a for t in tls for a, b in zip(t.launch, t.done, strict=True))
    return OverlapRow(strategy, accumulate, overlap(rank_spans), _hidden_in_backward(rank_spans),
                      sum(t.comm_seconds for t in tls), sum(t.hidden_seconds for t in tls),
                      sum(t.exposed_seconds for t in tls), sum(len(t.launch) for t in tls), out["calls"],
                      len(tls), sum(t.backward_end for t in tls) / len(tls), sizes, secs)


def measure_overlap(out_dir: str | Path, world_size: int = 2, steps: int = 2,
                    variants: Sequence[tuple[str, int]] = VARIANTS) -> tuple[list[OverlapRow], list[Path]]:
    """Run and trace each variant on `world_size` ranks; (rows, one merged trace file per variant)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, merged = [], []
    for strategy, accumulate in variants:
        outs = launch.run(profile_data_parallel, world_size, str(out_dir), strategy, steps, accumulate,
                          timeout=120)
        paths = {r: o["trace"] for r, o in enumerate(outs)}
        for r, o in enumerate(outs):
            rows.append(_row(strategy, accumulate, o, spans(json.loads(Path(o["trace"]).read_text()), r)))
        merged.append(merge_files(paths, out_dir / f"merged-{strategy}-x{accumulate}.json"))
    return rows, merged


def checks(row: OverlapRow) -> dict[str, bool]:
    """What must hold for one row (see the module docstring), by name."""
    return {"counts": row.trace.comm_spans == row.comm_log_calls == row.timeline_calls,
            "inside": row.trace.comm <= row.timeline_comm * (1 + SLACK) + 1e-3 * row.steps,
            "hidden": row.trace_hidden_in_backward <= row.timeline_hidden * (1 + SLACK) + 1e-3 * row.steps}


def fit_alpha_beta(sizes: Sequence[int], seconds: Sequence[float], p: int) -> MachineParams:
    """Least-squares alpha and beta of the ring all-reduce, t = 2(p-1) alpha + 2(p-1)/p n beta (chapter 1),
    from measured (bytes, seconds) pairs; each clipped at 0."""
    if len(sizes) != len(seconds) or len(set(sizes)) < 2 or p < 2:
        raise ValueError("fit_alpha_beta needs pairs of at least two different sizes and p >= 2")
    a = np.column_stack([np.full(len(sizes), 2.0 * (p - 1)), 2.0 * (p - 1) / p * np.asarray(sizes, float)])
    (alpha, beta), *_ = np.linalg.lstsq(a, np.asarray(seconds, float), rcond=None)
    return MachineParams(max(float(alpha), 0.0), max(float(beta), 0.0))
