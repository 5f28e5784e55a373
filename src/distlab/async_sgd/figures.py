"""The figures of chapter 3 and its lab. Book figures come from the deterministic pieces (the schedule
simulation and the delayed-SGD model); the lab also draws its measured runs with the same functions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab.async_sgd.cost_model import max_stable_lr
from distlab.async_sgd.problem import Problem
from distlab.async_sgd.simulate import simulate
from distlab.async_sgd.staleness import delayed_sgd
from distlab.explorers import live_explorer
from distlab.style import GREY, LINES, done

COLOURS = LINES[:-1]  # the palette's line colours, one per worker or run (black is kept for text)


def _slowdown(step_times: Sequence[float]) -> float:
    """How many times slower worker 1 is than the fastest other worker (1 when it is alone)."""
    return step_times[0] / min(step_times[1:]) if len(step_times) > 1 else 1.0


def _label(mode: str, staleness: int | float) -> str:
    return {"sync": "sync", "async": "async"}.get(mode, f"SSP (s={staleness})")


def schedule_figure(step_times: Sequence[float] = (4.0, 1.0, 1.0), steps: int = 6,
                    staleness: int = 1) -> Figure:
    """Who computes when under sync, SSP(staleness) and async (simulated, `schedule.simulate`): one row
    per worker, one bar per gradient, labelled with its staleness."""
    modes = [("sync", 0), ("ssp", staleness), ("async", math.inf)]
    runs = [simulate(m, step_times, steps, s) for m, s in modes]
    end = max(max(st.end for st in run) for run in runs)
    W = len(step_times)
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 1.0 + 0.55 * W * len(modes)), sharex=True)
    for ax, (mode, s), run in zip(axes, modes, runs, strict=True):
        for st in run:
            ax.barh(st.worker, st.end - st.start, left=st.start, height=0.6,
                    color=COLOURS[(st.worker - 1) % len(COLOURS)], edgecolor="white")
            if st.end - st.start >= 0.6:
                ax.text((st.start + st.end) / 2, st.worker, str(st.staleness), ha="center", va="center",
                        fontsize=7, color="white")
        finish = max(st.end for st in run)
        ax.axvline(finish, color=GREY, lw=0.8, ls="--")
        ax.set_title(f"{_label(mode, s)}: {len(run)} gradients in {finish:g} time units", fontsize=9,
                     loc="left")
        ax.set_yticks(range(1, W + 1), [f"worker {w}" for w in range(1, W + 1)])
        ax.invert_yaxis()
        ax.set_xlim(0, end * 1.02)
    axes[-1].set_xlabel("time (units of a fast worker's step)")
    fig.suptitle(f"Worker 1 is {_slowdown(step_times):g}x slower; the number on a bar is the "
                 "gradient's staleness", fontsize=10)
    fig.tight_layout()
    return done(fig)


def staleness_histogram_figure(staleness: Mapping[str, Sequence[int]], title: str = "") -> Figure:
    """One histogram per label of the staleness of every applied update."""
    fig, axes = plt.subplots(1, len(staleness), figsize=(3.2 * len(staleness), 2.8), sharey=True)
    axes = np.atleast_1d(axes)
    top = max(max(v) if len(v) else 0 for v in staleness.values())
    for k, (ax, (label, values)) in enumerate(zip(axes, staleness.items(), strict=True)):
        values = np.asarray(values, dtype=int)
        counts = np.bincount(values, minlength=top + 1) if len(values) else np.zeros(top + 1)
        ax.bar(np.arange(top + 1), counts / max(1, len(values)), color=COLOURS[k % len(COLOURS)])
        mean = values.mean() if len(values) else 0.0
        ax.set_title(f"{label}\nmean {mean:.2f}, max {values.max() if len(values) else 0}", fontsize=9)
        ax.set_xlabel("staleness (updates)")
    axes[0].set_ylabel("fraction of updates")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return done(fig)


def simulated_staleness_figure(step_times: Sequence[float] = (4.0, 1.0, 1.0), steps: int = 40,
                               staleness: int = 1) -> Figure:
    """Staleness histograms of the simulated sync, SSP and async runs of `schedule_figure`."""
    modes = [("sync", 0), ("ssp", staleness), ("async", math.inf)]
    data = {_label(m, s): [st.staleness for st in simulate(m, step_times, steps, s)] for m, s in modes}
    return staleness_histogram_figure(data, f"Simulated, {len(step_times)} workers, worker 1 "
                                            f"{_slowdown(step_times):g}x slower")


def staleness_cost_figure(taus: Sequence[int] = (0, 2, 4, 8), lr: float = 0.1, steps: int = 150) -> Figure:
    """Left: the largest stable learning rate against the delay tau on a quadratic (`max_stable_lr`).
    Right: the chapter's MLP trained with gradients tau steps old, all at learning rate `lr`."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    t = np.arange(0, 33)
    a.plot(t, [max_stable_lr(1.0, int(k)) for k in t], "o-", ms=3, label=r"$2\sin(\pi/(4\tau+2))$")
    a.plot(t[1:], np.pi / (2 * t[1:]), "--", color=GREY, label=r"$\pi/(2\tau)$")
    a.set_xlabel(r"delay $\tau$ (updates)")
    a.set_ylabel(r"largest stable $\eta h$")
    a.set_yscale("log")
    a.set_title(r"Stability of $x_{t+1} = x_t - \eta h\, x_{t-\tau}$", fontsize=10)
    a.legend(fontsize=8)
    for k, tau in enumerate(taus):
        losses = delayed_sgd(Problem(), tau, lr, steps)
        shown = np.where(np.isfinite(losses), losses, np.nan)
        b.plot(np.arange(len(losses)), shown, color=COLOURS[k % len(COLOURS)], label=rf"$\tau$ = {tau}")
    b.set_yscale("log")
    b.set_ylim(top=10)
    b.set_xlabel("update")
    b.set_ylabel("training loss (MSE)")
    b.set_title(f"MLP, SGD with lr = {lr:g}, gradients $\\tau$ updates old", fontsize=10)
    b.legend(fontsize=8)
    fig.tight_layout()
    return done(fig)


def loss_figure(curves: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], title: str = "") -> Figure:
    """Loss against gradients applied (left) and against seconds (right), one line per run
    (`runs.loss_curve` gives the three arrays)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for k, (label, (grads, secs, loss)) in enumerate(curves.items()):
        c = COLOURS[k % len(COLOURS)]
        a.plot(grads, loss, color=c, label=label)
        b.plot(secs, loss, color=c, label=label)
    a.set_xlabel("gradients applied")
    b.set_xlabel("wall-clock time (s)")
    a.set_ylabel("training loss (MSE)")
    a.set_yscale("log")
    a.set_title("per gradient: statistical efficiency", fontsize=10)
    b.set_title("per second: what you wait for", fontsize=10)
    b.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return done(fig)


def schedule_frame(slowdown: float = 4.0, workers: int = 3, s: int = 1) -> list[Figure]:
    """What the schedule explorer shows: one worker `slowdown` times slower than the other `workers` - 1,
    under SSP with staleness bound `s`: the simulated schedule and its staleness histograms."""
    times = [slowdown] + [1.0] * (workers - 1)
    return [schedule_figure(times, steps=6, staleness=s),
            simulated_staleness_figure(times, steps=40, staleness=s)]


def schedule_explorer():  # -> ipywidgets.Widget
    """Sliders for the straggler's slowdown, the number of workers and s, redrawing the simulated
    schedule and its staleness histograms (`schedule_frame`, also the static book version)."""
    import ipywidgets as widgets

    controls = {
        "slowdown": widgets.FloatSlider(value=4.0, min=1.0, max=8.0, step=0.5, description="slowdown"),
        "workers": widgets.IntSlider(value=3, min=1, max=6, description="workers"),
        "s": widgets.IntSlider(value=1, min=0, max=6, description="SSP s")}
    return live_explorer("async-schedule", schedule_frame, controls, {"slowdown": [1.0, 4.0], "s": [0, 1, 3]})
