"""The figures of chapter 13, drawn from traces and reports the package computes.

- `trace_figure`: one profiled step of every rank, a row per rank and thread, computation and
  communication as bars (what Perfetto shows of the merged trace, in matplotlib);
- `overlap_figure`: per variant and rank, communication split into hidden and exposed, beside computation;
- `straggler_figure`: per rank, work and wait per step, and the outlier threshold;
- `memory_figure`: allocated memory over one training step, with the estimator's predicted peak and phase.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from distlab.observe.trace import Span
from distlab.style import COMMUNICATION, COMPUTE, GREY, VERMILION, styled

COLOURS = {"compute": COMPUTE, "comm": COMMUNICATION}


@styled
def trace_figure(by_rank: Mapping[int, Sequence[Span]], title: str, step: int = 0) -> Figure:
    """Step `step` of each rank (its `distlab:step` window; a trace without such ranges is one window from
    its first span to its last), a row per rank and thread; times in ms from the earliest start of that
    step on any rank."""
    windows = {r: _step_windows(sp) for r, sp in by_rank.items()}
    if any(len(w) <= step for w in windows.values()):
        raise ValueError(f"step={step}: every rank's trace must hold at least {step + 1} step range(s)")
    t0 = min(w[step][0] for w in windows.values())
    rows = _rows(by_rank)
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.38 * len(rows)))
    for y, (r, row) in enumerate(reversed(rows)):
        _draw_row(ax, y, [s for s in by_rank[r] if s.row == row], windows[r][step], t0)
    ax.set_yticks([y + 0.5 for y in range(len(rows))], [f"rank {r} {row}" for r, row in reversed(rows)])
    ax.set_xlabel("ms from the step's start (| marks the rank's end of step); blue computation, orange "
                  "communication")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def _step_windows(rank_spans: Sequence[Span]) -> list[tuple[float, float]]:
    """A rank's `distlab:step` windows in time order, or one window from its first span to its last."""
    return (sorted((s.start, s.end) for s in rank_spans if s.kind == "step")
            or [(min(s.start for s in rank_spans), max(s.end for s in rank_spans))])


def _rows(by_rank: Mapping[int, Sequence[Span]]) -> list[tuple[int, str]]:
    """(rank, row) of every row that holds a span other than a step, by rank then row name."""
    return [(r, row) for r, sp in sorted(by_rank.items())
            for row in sorted({s.row for s in sp if s.kind != "step"})]


def _draw_row(ax: Axes, y: int, row_spans: Sequence[Span], window: tuple[float, float], t0: float) -> None:
    """One row of `trace_figure` at height `y`: its spans clipped to `window` as bars of their kind's
    colour (ms from `t0`), and a tick at the window's end."""
    a, b = window
    for kind, colour in COLOURS.items():
        bars = [(max(s.start, a) - t0, min(s.end, b) - max(s.start, a)) for s in row_spans
                if s.kind == kind and s.end > a and s.start < b]
        ax.broken_barh([(x * 1e3, w * 1e3) for x, w in bars], (y + 0.1, 0.8), color=colour)
    ax.plot([(b - t0) * 1e3], [y + 0.5], marker="|", color="black", markersize=10)


@styled
def overlap_figure(rows: Sequence, title: str = "Communication hidden and exposed, from the traces"
                   ) -> Figure:
    """Horizontal bars per (variant, rank) of `measured.OverlapRow`s: computation, hidden and exposed
    communication, idle (ms per step)."""
    fig, ax = plt.subplots(figsize=(8, 0.8 + 0.32 * len(rows)))
    labels = []
    for y, row in enumerate(reversed(rows)):
        o, n = row.trace, row.steps
        parts = [(o.compute - o.hidden, COMPUTE, "computation only"),
                 (o.hidden, GREY, "hidden communication"), (o.exposed, VERMILION, "exposed communication"),
                 (o.idle, "white", "idle")]
        left = 0.0
        for value, colour, name in parts:
            ax.barh(y, value / n * 1e3, left=left, color=colour, edgecolor="black", linewidth=0.3,
                    label=name if y == 0 else None)
            left += value / n * 1e3
        labels.append(f"{row.label}, rank {o.rank}: {o.hidden_fraction:.0%} hidden")
    ax.set_yticks(range(len(rows)), labels)
    ax.set_xlabel("ms per step")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45 if len(rows) < 6 else -0.2), ncol=4, fontsize=7)
    fig.tight_layout()
    return fig


@styled
def straggler_figure(report, title: str = "Work and wait per step, by rank") -> Figure:
    """Per rank, the median work and wait seconds per step of a `straggler.StragglerReport`, stacked, and
    the outlier threshold on work."""
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ranks = range(len(report.work))
    ax.bar(ranks, [w * 1e3 for w in report.work], color=COMPUTE, label="work")
    ax.bar(ranks, [w * 1e3 for w in report.wait], bottom=[w * 1e3 for w in report.work], color=COMMUNICATION,
           label="wait in the all-reduce")
    ax.axhline(report.threshold * 1e3, color=VERMILION, ls="--", lw=1, label="threshold: median + k x MAD")
    ax.set_xticks(list(ranks), [f"rank {r}" + (" (straggler)" if r in report.stragglers else "")
                                for r in ranks])
    ax.set_ylabel("ms per step")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@styled
def memory_figure(curve, predicted_bytes: int, predicted_phase: str,
                  title: str = "Live memory over one training step") -> Figure:
    """An `allocations.MemoryCurve` as a step line, the phases shaded, the predicted peak as a line."""
    fig, ax = plt.subplots(figsize=(7, 2.8))
    shades = {"forward": COMPUTE, "backward": COMMUNICATION, "optimizer": GREY}
    for phase, (a, b) in curve.phases.items():
        ax.axvspan(a * 1e3, b * 1e3, color=shades.get(phase, GREY), alpha=0.12)
        ax.text((a + b) / 2 * 1e3, 0.02, phase, transform=ax.get_xaxis_transform(), ha="center", fontsize=7)
    ax.step([t * 1e3 for t in curve.times], [v / 2**20 for v in curve.live], where="post", color="black",
            lw=1, label="measured (profiler memory events)")
    ax.axhline(predicted_bytes / 2**20, color=VERMILION, ls="--", lw=1,
               label=f"chapter 7's predicted peak ({predicted_phase})")
    ax.plot([curve.peak_time * 1e3], [curve.peak_bytes / 2**20], "o", color=VERMILION, ms=4,
            label=f"measured peak ({curve.peak_phase})")
    ax.set_xlabel("ms from the start of the step")
    ax.set_ylabel("live MiB")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def book_trace_figure() -> Figure:
    """One traced step of chapter 2's overlapped strategy on 2 CPU ranks (gloo), measured when the book is
    built: a row per rank and thread."""
    import json
    import tempfile

    from distlab.observe.measured import measure_overlap
    from distlab.observe.trace import split

    with tempfile.TemporaryDirectory() as d:
        _, merged = measure_overlap(d, world_size=2, steps=1, variants=[("overlapped", 1)])
        by_rank = split(json.loads(merged[0].read_text()))
    return trace_figure(by_rank, "One step of overlapped data parallelism, 2 CPU ranks (gloo), from the "
                                 "merged trace")


def book_memory_figure() -> Figure:
    """Live memory over one step of the course's GPT (2 layers, width 64, batch 8 x 32 tokens, fp32 Adam)
    on the CPU, beside chapter 7's predicted peak."""
    from distlab.memory import MemoryConfig, predict_peak
    from distlab.observe.allocations import gpt_step_curve

    config = MemoryConfig(layers=2, hidden=64, heads=4, vocab=256, seq=32, micro_batch=8, precision="fp32",
                          recompute="none", attention="flash", dropout=False, adam="for-loop", device="cpu")
    predicted = predict_peak(config)
    curve = gpt_step_curve(layers=2, hidden=64, heads=4, vocab=256, batch=8, seq=32)
    return memory_figure(curve, predicted.peak_bytes, predicted.phase,
                         "One training step of the GPT (2 layers, width 64, batch 8 x 32), fp32 Adam, CPU")


def hang_frame(rank: int = 2, collective: int = 5, mistake: str = "skip") -> list[tuple[str, str]]:
    """A table: the last three entries of each of 4 ranks' flight record when `rank` makes `mistake` at
    collective number `collective` of the planted program (3 steps) and every rank stops at the hang, and
    what `hang.diagnose` names."""
    import random

    from distlab.observe.exercises import hang_records
    from distlab.observe.hang import diagnose
    from distlab.observe.plant import STEP, Planting

    planting = Planting(rank, (collective - 1) // len(STEP), (collective - 1) % len(STEP), mistake)
    records = hang_records(3, 4, planting, random.Random(0), extra=0)  # every rank stops at the hang
    rows = [(f"rank {r}", ", ".join(f"#{x.seq} {x.describe()}" for x in recs[-3:]))
            for r, recs in records.items()]
    found = diagnose(records)
    return rows + [("diagnosis", found.verdict() if found else "the records agree")]


def hang_explorer():  # -> ipywidgets.Widget
    """A widget: plant a mistake (which rank, which collective, which kind) and see the last records of
    each rank and the diagnosis (`hang_frame`, also the static book version over a small grid)."""
    import ipywidgets as widgets

    from distlab.explorers import live_explorer

    c = {"rank": widgets.IntSlider(value=2, min=0, max=3, description="rank"),
         "collective": widgets.IntSlider(value=5, min=1, max=8, description="collective #"),
         "mistake": widgets.Dropdown(options=["skip", "order", "size"], value="skip", description="mistake")}
    return live_explorer("observe-hang", hang_frame, c,
                         {"rank": [0, 2], "collective": [2, 5, 8], "mistake": ["skip", "order", "size"]})
