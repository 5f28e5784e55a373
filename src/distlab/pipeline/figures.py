"""The pictures of chapter 4: Gantt timelines of schedules (simulated or measured), the bubble against the
number of microbatches, the peak stash per rank, 1F1B beside the zero-bubble schedules, and two
ipywidgets explorers. All are drawn from the same `Schedule` data the executor runs."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from distlab.explorers import live_explorer, message_figure
from distlab.pipeline.actions import COMPUTE
from distlab.pipeline.cost_model import bubble_fraction, zero_bubble_fraction
from distlab.pipeline.schedules import make_schedule
from distlab.pipeline.simulate import Event, simulate, timeline_stats
from distlab.style import COMMUNICATION, GREEN, LINES, PURPLE, RC, done
from distlab.style import COMPUTE as COMPUTE_COLOUR

COLOURS = {"F": COMPUTE_COLOUR, "B": GREEN, "W": PURPLE, "comm": COMMUNICATION}  # one per kind of pass


def _styled(draw: Callable[..., Figure]) -> Callable[..., Figure]:
    """Draw a figure with the course's rcParams, lay it out, and detach it from pyplot."""
    @functools.wraps(draw)
    def drawn(*args: Any, **kwargs: Any) -> Figure:
        with mpl.rc_context(dict(RC)):
            fig = draw(*args, **kwargs)
            fig.tight_layout()
        return done(fig)
    return drawn


STAGE_UNIT = "$t_f$: one rank's forward pass of its stage"  # the x axis of the simulated timelines


def draw_timeline(ax: Axes, events: Sequence[Event], p: int, title: str, unit: str = "$t_f$",
                  labels: bool = True) -> None:
    """One Gantt chart: a row per rank, F in blue, B in green and W (the weight gradient of a split
    backward) in purple, paler for later model chunks; time a rank waits in a send or receive in orange
    (idle: the bubble); each box is labelled with its microbatch, in dark text on the paler boxes."""
    num_stages = max(e.action.stage for e in events) + 1
    for e in events:
        a = e.action
        width = e.end - e.start
        if a.op in COMPUTE:
            chunk = a.stage // p
            alpha = 1.0 - 0.45 * chunk / max(1, (num_stages // p) - 1) if num_stages > p else 1.0
            ax.barh(e.rank, width, left=e.start, height=0.8, color=COLOURS[a.op], alpha=alpha,
                    edgecolor="white", linewidth=0.5)
            if labels and width > 0:
                ax.text(e.start + width / 2, e.rank, str(a.microbatch), ha="center", va="center",
                        fontsize=7, color="white" if alpha > 0.8 else "black")
        elif width > 0:
            ax.barh(e.rank, width, left=e.start, height=0.3, color=COLOURS["comm"])
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel(f"time (in {unit})")
    ax.set_title(title)


@_styled
def timeline_figure(events: Sequence[Event], p: int, title: str, unit: str = "$t_f$") -> Figure:
    """A Gantt chart of one timeline, with its bubble in the title."""
    fig, ax = plt.subplots(figsize=(10, 0.5 * p + 1.2))
    stats = timeline_stats(events, p)
    draw_timeline(ax, events, p, f"{title} (bubble {stats.mean_bubble:.0%})", unit)
    return fig


@_styled
def measured_vs_simulated_figure(measured: Sequence[Event], p: int, t_f: float, t_b: float, name: str,
                                 m: int, v: int = 1, t_w: float = 0.0) -> Figure:
    """The measured timeline of a run (in ms) above the simulated one for the same schedule, with the
    mean measured forward, backward and weight-gradient times t_f, t_b and t_w (seconds; t_w only for a
    zero-bubble schedule) and no transfer time."""
    sim = simulate(make_schedule(name, p, m, v), t_f, t_b, t_w=t_w)
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.0 * p + 2.4), sharex=True)
    for ax, events, what in ((axes[0], measured, "measured"), (axes[1], sim, "simulated (ideal)")):
        ms = [Event(e.rank, e.action, e.start * 1e3, e.end * 1e3) for e in events]
        bubble = timeline_stats(events, p).mean_bubble
        draw_timeline(ax, ms, p, f"{name}, p={p}, m={m}" + (f", v={v}" if v > 1 else "")
                      + f": {what}, bubble {bubble:.0%}", unit="ms")
    return fig


@_styled
def schedules_figure(p: int = 4, m: int = 8, v: int = 2) -> Figure:
    """Naive model parallelism, GPipe, 1F1B and interleaved 1F1B on the same model, simulated with
    t_b = 2 t_f per rank (per chunk: divided by v) and free transfers."""
    rows = [("naive", 1, 1), ("gpipe", m, 1), ("1f1b", m, 1), ("interleaved", m, v)]
    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 1.05 * p * len(rows) + 1), sharex=True)
    for ax, (name, mm, vv) in zip(axes, rows, strict=True):
        events = simulate(make_schedule(name, p, mm, vv), 1.0 / vv, 2.0 / vv)
        stats = timeline_stats(events, p)
        extra = f", v={vv}" if vv > 1 else ""
        draw_timeline(ax, events, p, f"{name}: p={p}, m={mm}{extra}; bubble {stats.mean_bubble:.0%} "
                      f"(formula {bubble_fraction(p, mm, vv):.0%}), peak stash {max(stats.peak_stash)}"
                      + (" chunks" if vv > 1 else " microbatches"), unit=STAGE_UNIT)
    return fig


@_styled
def bubble_figure(p: int = 4, ms: Sequence[int] = (4, 8, 12, 16, 24, 32),
                  vs: Sequence[int] = (1, 2, 4)) -> Figure:
    """The bubble against m: the formula (lines) and the simulated schedules (markers), for several v."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    dense = range(1, max(ms) + 1)
    for v, colour in zip(vs, LINES, strict=False):
        ax.plot(list(dense), [bubble_fraction(p, m, v) for m in dense], "-", color=colour,
                label=f"(p-1)/(v m + p-1), v={v}")
        name = "1f1b" if v == 1 else "interleaved"
        sim = [timeline_stats(simulate(make_schedule(name, p, m, v), 1 / v, 2 / v), p).mean_bubble
               for m in ms]
        ax.plot(ms, sim, "o", color=colour, label=f"simulated {name}, v={v}")
    ax.set_xlabel("microbatches m")
    ax.set_ylabel("bubble (fraction of the step)")
    ax.set_title(f"Pipeline bubble, p = {p} ranks, t_b = 2 t_f")
    ax.set_ylim(0, None)
    ax.legend()
    return fig


@_styled
def stash_figure(p: int = 4, m: int = 8, v: int = 2) -> Figure:
    """Peak microbatches stashed per rank: GPipe holds all m, 1F1B at most p - r, interleaved counted in
    whole-stage units (chunks / v)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    width = 0.27
    for k, (name, vv) in enumerate((("gpipe", 1), ("1f1b", 1), ("interleaved", v))):
        peaks = timeline_stats(simulate(make_schedule(name, p, m, vv)), p).peak_stash
        ax.bar([r + (k - 1) * width for r in range(p)], [x / vv for x in peaks], width, color=LINES[k],
               label=name + (f" (v={vv}, chunks / v)" if vv > 1 else ""))
    ax.set_xticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylabel("peak stashed microbatches")
    ax.set_title(f"Activation memory: p = {p}, m = {m}")
    ax.set_ylim(0, m * 1.4)  # room for the legend above the bars
    ax.legend(ncols=3, loc="upper center")
    return fig


SCHEDULES = ["naive", "gpipe", "1f1b", "interleaved", "zbh1", "zbv"]


def pipeline_frame(schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2, tb: float = 2.0,
                   tcomm: float = 0.0) -> Figure:
    """What the pipeline explorer shows: the simulated timeline of `schedule` with t_b = tb t_f and
    transfers of tcomm t_f, its bubble (simulated, and the formula where there is one), the peak stash per
    rank and the number of messages in the title; a setting the schedule rejects shows why."""
    v = v if schedule == "interleaved" else 2 if schedule == "zbv" else 1
    m = 1 if schedule == "naive" else m
    try:
        s = make_schedule(schedule, p, m, v)
    except ValueError as e:
        return message_figure(str(e))
    split = s.split_backward  # a zero-bubble schedule: B and W take half of t_b each
    t_b = tb / v
    events = simulate(s, 1.0 / v, t_b / 2 if split else t_b, tcomm, t_w=t_b / 2 if split else 0.0)
    st = timeline_stats(events, p)
    formula = "" if split else f", formula {bubble_fraction(p, m, v):.1%}"
    sends = sum(a.op.startswith("send") for actions in s.actions for a in actions)
    chunks = f"v={v}" if schedule in ("interleaved", "zbv") else "one chunk per rank"  # v is interleaved's
    fig = timeline_figure(events, p, f"{schedule}, p={p}, m={m}, {chunks}, t_b/t_f={tb:g}, "
                                     f"transfer {tcomm:g} t_f")
    fig.suptitle(f"bubble: simulated {st.mean_bubble:.1%}{formula}; peak stash per rank "
                 f"{list(st.peak_stash)}; messages {sends}", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def pipeline_explorer():  # -> ipywidgets.Widget
    """Sliders for p, m, v, the schedule and t_b / t_f; draws the simulated timeline and its numbers
    (`pipeline_frame`, also the static book version over a small grid)."""
    import ipywidgets as widgets

    w = {"schedule": widgets.Dropdown(options=SCHEDULES, value="1f1b", description="schedule"),
         "p": widgets.IntSlider(value=4, min=1, max=8, description="p"),
         "m": widgets.IntSlider(value=8, min=1, max=32, description="m"),
         "v": widgets.IntSlider(value=2, min=1, max=4, description="v"),
         "tb": widgets.FloatSlider(value=2, min=0.5, max=4, description="t_b/t_f"),
         "tcomm": widgets.FloatSlider(value=0.0, min=0, max=1, step=0.05, description="t_comm/t_f")}
    rows = [widgets.HBox([w["schedule"], w["p"], w["m"]]), widgets.HBox([w["v"], w["tb"], w["tcomm"]])]
    # The static version (the book) moves what the lab asks to try: m below and above p, t_b/t_f of 1 and 2,
    # no transfer time and 0.3 t_f; p = 4 and v = 2 (the interleaved schedule's chunks) are held.
    grid = {"schedule": ["gpipe", "1f1b", "interleaved", "zbh1"], "m": [2, 8], "tb": [1.0, 2.0],
            "tcomm": [0.0, 0.3]}
    return live_explorer("pipeline", pipeline_frame, w, grid, rows)


ZERO_BUBBLE_ROWS = (("1f1b", 1), ("zbh1", 1), ("zbv", 2))


@_styled
def zero_bubble_figure(p: int = 4, m: int = 8, t_f: float = 1.0, t_b: float = 1.0,
                       t_w: float = 1.0) -> Figure:
    """1F1B, ZB-H1 and ZB-V on the same model (Qi et al. 2023; 2024), simulated with free transfers: F, B
    and W of one rank's whole share take t_f, t_b and t_w (1F1B's backward, unsplit, t_b + t_w; ZB-V's
    chunks half of each). The W boxes (purple) sit where 1F1B's ranks wait."""
    # 8 inches wide rather than 10: at page width the labels of ZB-V's half-length boxes stay legible.
    fig, axes = plt.subplots(len(ZERO_BUBBLE_ROWS), 1, figsize=(8, 1.05 * p * 3 + 1), sharex=True)
    for ax, (name, v) in zip(axes, ZERO_BUBBLE_ROWS, strict=True):
        events = simulate(make_schedule(name, p, m, v), t_f / v, t_b / v, t_w=t_w / v)
        stats = timeline_stats(events, p)
        try:
            formula = f" (formula {zero_bubble_fraction(name, p, m, t_f / v, t_b / v, t_w / v):.0%})"
        except ValueError:  # no closed form for these sizes and times
            formula = ""
        peak = max(stats.peak_stash) / v
        draw_timeline(ax, events, p, f"{name}: p={p}, m={m}" + (f", v={v}" if v > 1 else "")
                      + f"; bubble {stats.mean_bubble:.0%}{formula}, peak stash {peak:g} microbatches",
                      unit=STAGE_UNIT)
    return fig


def zero_bubble_explorer():  # -> ipywidgets.Widget
    """Sliders for p, m and the times of B and W (in units of t_f): 1F1B, ZB-H1 and ZB-V side by side
    (`zero_bubble_figure`, also the static book version over a small grid)."""
    import ipywidgets as widgets

    w = {"p": widgets.IntSlider(value=4, min=1, max=8, description="p"),
         "m": widgets.IntSlider(value=8, min=1, max=24, description="m"),
         "t_f": widgets.fixed(1.0),  # the unit of time: held, and named in the static view's note
         "t_b": widgets.FloatSlider(value=1, min=0.25, max=3, step=0.25, description="t_b/t_f"),
         "t_w": widgets.FloatSlider(value=1, min=0.25, max=3, step=0.25, description="t_w/t_f")}
    rows = [widgets.HBox([w["p"], w["m"]]), widgets.HBox([w["t_b"], w["t_w"]])]
    return live_explorer("zero-bubble", zero_bubble_figure, w, {"p": [2, 4], "t_w": [0.5, 1.0, 2.0]}, rows)
