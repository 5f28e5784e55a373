"""Chapter 11's pictures (parts 1-2), drawn from the code they illustrate.

- `hsdp_cluster_figure`: HSDP against ZeRO-3 on a chapter-8 cluster, communication seconds per step and
  model-state GB per GPU over the number of servers (`cost_model.compare_on_cluster`).
- `replica_loss_figure`: the loss curve of a run in which a replica was killed, beside one process on the
  survivors' data and one process on every replica's data (`replicas`, `parity`).
- `goodput_figure` and `goodput_explorer`: useful steps per hour over the failure rate, checkpoint-restart
  (Daly's interval) against replicas that heal (`goodput`); the explorer's frame is `goodput_frame`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab.explorers import live_explorer
from distlab.fault_tolerance import cost_model, goodput
from distlab.style import BLUE, GREY, ORANGE, VERMILION, styled

RATES = np.geomspace(0.1, 200.0, 60)  # failures per day of the whole job


@styled
def hsdp_cluster_figure(server: str = "DGX H100", psi: float = 7e9,
                        nodes: Sequence[int] = (1, 2, 4, 8, 16)) -> Figure:
    """Communication seconds per step and model-state GB per GPU, HSDP (one replica group per server)
    against ZeRO-3 over every GPU, for a model of `psi` parameters in bf16 with mixed-precision Adam."""
    rows = cost_model.compare_on_cluster(server, nodes, psi)
    n = [r["nodes"] for r in rows]
    fig = plt.figure(figsize=(7.6, 2.9))
    ax, mem = fig.subplots(1, 2)
    ax.plot(n, [r["zero3_flat_s"] for r in rows], "o-", color=GREY, label="ZeRO-3, flat ring")
    ax.plot(n, [r["zero3_s"] for r in rows], "o-", color=VERMILION, label="ZeRO-3, two-level rings")
    ax.plot(n, [r["hsdp_s"] for r in rows], "o-", color=BLUE, label="HSDP (S = GPUs per server)")
    ax.plot(n, [r["hsdp_across_s"] for r in rows], "--", color=BLUE, label="HSDP, across servers only")
    ax.set(xscale="log", xlabel=f"{server} servers", ylabel="communication per step (s)",
           title=f"Psi = {psi / 1e9:g}B, bf16: predicted seconds")
    ax.set_xticks(n, [str(v) for v in n])
    ax.legend(frameon=False)
    mem.plot(n, [r["zero3_GB"] for r in rows], "o-", color=VERMILION, label="ZeRO-3")
    mem.plot(n, [r["hsdp_GB"] for r in rows], "o-", color=BLUE, label="HSDP")
    mem.set(xscale="log", yscale="log", xlabel=f"{server} servers", ylabel="model states per GPU (GB)",
            title="16 bytes per parameter (Adam, mixed precision)")
    mem.set_xticks(n, [str(v) for v in n])
    mem.legend(frameon=False)
    fig.tight_layout()
    return fig


@styled
def replica_loss_figure(losses: Mapping[int, float], survivors: Sequence[float], everyone: Sequence[float],
                        kill_step: int, join_step: int | None = None) -> Figure:
    """The run with a killed replica (dots) on the curve of one process trained on the survivors' data;
    one process on every replica's data for contrast."""
    fig = plt.figure(figsize=(5.6, 2.8))
    ax = fig.subplots()
    steps = sorted(losses)
    ax.plot(range(len(everyone)), everyone, "-", color=GREY, label="one process, every replica's data")
    ax.plot(range(len(survivors)), survivors, "-", color=BLUE, label="one process, the quorum's data")
    ax.plot(steps, [losses[s] for s in steps], "o", color=ORANGE, label="replicas with a failure")
    ax.axvline(kill_step, color=VERMILION, lw=1, ls=":")
    ax.text(kill_step, ax.get_ylim()[1], " killed", color=VERMILION, va="top", fontsize=8)
    if join_step is not None:
        ax.axvline(join_step, color=BLUE, lw=1, ls=":")
        ax.text(join_step, ax.get_ylim()[1], " joined", color=BLUE, va="top", fontsize=8)
    ax.set(xlabel="step", ylabel="loss (mean over the quorum)")
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


@styled
def goodput_figure(failures_per_day: float = 10.0, checkpoint_s: float = 60.0, restart_s: float = 300.0,
                   replicas: int = 8, step_s: float = 2.0, detect_s: float = 1.0, heal_s: float = 10.0,
                   replace_s: float = 300.0) -> Figure:
    """Useful steps per hour over the job's failure rate: checkpoint-restart at Daly's interval (and
    at Young's) against replicas that heal; the chosen rate is marked."""
    ckpt = [goodput.checkpoint_goodput(goodput.mtbf_from_rate(r), step_s, checkpoint_s, restart_s)
            for r in RATES]
    young = [goodput.checkpoint_goodput(goodput.mtbf_from_rate(r), step_s, checkpoint_s, restart_s,
                                        interval=c["young_interval"])["steps_per_hour"]
             for r, c in zip(RATES, ckpt, strict=True)]
    heal = [goodput.healing_goodput(goodput.mtbf_from_rate(r), step_s, detect_s, heal_s, replicas,
                                    replace_s)["steps_per_hour"] for r in RATES]
    fig = plt.figure(figsize=(5.6, 3.0))
    ax = fig.subplots()
    ax.axhline(3600 / step_s, color=GREY, lw=1, ls=":", label="no failures")
    ax.plot(RATES, [c["steps_per_hour"] for c in ckpt], color=VERMILION, label="checkpoint-restart, Daly")
    ax.plot(RATES, young, "--", color=VERMILION, lw=1, label="checkpoint-restart, Young")
    ax.plot(RATES, heal, color=BLUE, label=f"{replicas} replicas that heal")
    ax.axvline(failures_per_day, color=ORANGE, lw=1)
    ax.set(xscale="log", ylim=(0, 3600 / step_s * 1.05), xlabel="failures per day (whole job)",
           ylabel="useful steps per hour",
           title=f"step {step_s:g} s, checkpoint {checkpoint_s:g} s, restart {restart_s:g} s")
    ax.legend(frameon=False, fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def goodput_frame(failures_per_day: float, checkpoint_s: float, replicas: int) -> list:
    """The explorer's frame: the figure, and a table of both methods at the chosen rate."""
    fig = goodput_figure(failures_per_day, checkpoint_s, replicas=replicas)
    m = goodput.mtbf_from_rate(failures_per_day)
    ckpt = goodput.checkpoint_goodput(m, 2.0, checkpoint_s, 300.0)
    heal = goodput.healing_goodput(m, 2.0, 1.0, 10.0, replicas, 300.0)
    fig.axes[0].text(0.99, 0.5, f"Daly interval {ckpt['interval'] / 60:.0f} min\n"
                     f"checkpoint-restart {ckpt['fraction']:.1%}\nhealing {heal['fraction']:.1%}",
                     transform=fig.axes[0].transAxes, ha="right", va="center", fontsize=8)
    return [fig]


def goodput_explorer():  # -> ipywidgets.Widget
    """Sliders for the failure rate, the checkpoint's cost and the number of replicas (`goodput_frame`,
    also the static book version, whose checkpoint slider starts at its first value, 30 s)."""
    import ipywidgets as widgets

    controls = {"failures_per_day": widgets.FloatLogSlider(value=10.0, base=10, min=-1, max=2.3,
                                                           description="failures/day"),
                "checkpoint_s": widgets.FloatSlider(value=60.0, min=10.0, max=600.0, step=10.0,
                                                    description="checkpoint s"),
                "replicas": widgets.IntSlider(value=8, min=2, max=64, description="replicas")}
    return live_explorer("goodput", goodput_frame, controls,
                         {"failures_per_day": [1.0, 10.0, 100.0], "checkpoint_s": [30.0, 300.0]},
                         start={"failures_per_day": 10.0, "checkpoint_s": 30.0})
