"""The planner's pictures: every candidate as memory against predicted step time, and the step-time terms
of the planner's choice beside the published configuration's. Both are drawn from `planner`'s rows."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab import style
from distlab.plan.cost_model import TERMS
from distlab.plan.planner import Row, evaluate, judge, plan
from distlab.plan.published import OPTIONS_OF_THE_TIME, lookup

TERM_COLOURS = dict(zip(TERMS, (style.COMPUTE, style.SKY_BLUE, style.IDLE, style.ORANGE, style.PURPLE,
                                style.YELLOW, style.VERMILION), strict=True))


def candidates_figure(published: str = "megatron-1t", efficiency: float | None = None,
                      rows: Sequence[Row] | None = None) -> Figure:
    """Predicted GB per GPU against predicted step time for every candidate of a published run's model,
    cluster and batch: those that fit, those that do not, the planner's first choice and the published
    configuration."""
    run = lookup(published)
    model, cluster, workload = run.model_spec(), run.cluster(), run.workload(efficiency)
    rows = list(rows) if rows is not None else evaluate(model, cluster, workload, run.settings)
    pub = judge(run, efficiency)
    with mpl.rc_context(dict(style.RC)):
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        for ok, colour, label in ((False, style.FAIL, "does not fit"), (True, style.PASS, "fits")):
            pts = np.array([(r.time.total, r.memory.peak_bytes / 1e9) for r in rows if r.fits == ok])
            if len(pts):
                ax.scatter(pts[:, 0], pts[:, 1], s=6, color=colour, alpha=0.5, lw=0, label=label)
        kept = [r for r in rows if r.fits]
        if kept:
            best = min(kept, key=lambda r: (r.time.total, r.memory.peak_bytes))
            ax.scatter([best.time.total], [best.memory.peak_bytes / 1e9], marker="D", s=40,
                       color=style.BLUE, label=f"planner: {best.candidate.label()}")
        ax.scatter([pub["time"]["total"]], [pub["peak_bytes"] / 1e9], marker="*", s=120, color="black",
                   label=f"published ({run.where})")
        ax.axhline(cluster.memory_bytes / 1e9, color=style.FAIL, ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("predicted step time (s)")
        ax.set_ylabel("predicted GB per GPU")
        ax.set_title(f"{run.name}: {len(rows)} configurations on {cluster.gpus} {cluster.gpu}")
        ax.legend(loc="upper right", fontsize=7)
        fig.tight_layout()
    return style.done(fig)


def terms_figure(rows: Sequence[tuple[str, dict[str, float]]]) -> Figure:
    """Stacked bars of step-time terms, one bar per (label, `StepTime.to_dict()`)."""
    with mpl.rc_context(dict(style.RC)):
        fig, ax = plt.subplots(figsize=(7.5, 1.0 + 0.5 * len(rows)))
        left = np.zeros(len(rows))
        labels = [label for label, _ in rows]
        for term in TERMS:
            values = np.array([t[term] for _, t in rows])
            ax.barh(labels, values, left=left, color=TERM_COLOURS[term], label=term)
            left += values
        ax.set_xlabel("predicted seconds per step (no overlap)")
        ax.invert_yaxis()
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        fig.tight_layout()
    return style.done(fig)


def published_terms_figure(published: str = "megatron-1t", efficiency: float | None = None) -> Figure:
    """The step-time terms of a published configuration, of the planner's first choice among the options of
    its time (`published.OPTIONS_OF_THE_TIME`), and of its first choice among all options."""
    run = lookup(published)
    model, cluster, workload = run.model_spec(), run.cluster(), run.workload(efficiency)
    then = OPTIONS_OF_THE_TIME[published]
    bars = [("published", judge(run, efficiency)["time"])]
    for label, space in (("planner, options of the time", then), ("planner, all options", {})):
        best = plan(model, cluster, workload, run.settings, **space)[0]
        bars.append((f"{label}\n{best.candidate.label()}", best.time.to_dict()))
    return terms_figure(bars)
