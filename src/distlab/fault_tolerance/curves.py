"""Section 3's picture: loss against tokens and against modelled wall time for each method.

The wall time is modelled, not slept: an inner step lasts t = c + V / L (`bandwidth.step_seconds`), with
V the bytes the method sent per step on the ranks (counted by `comm_log`) scaled up to a model of
`n_params` parameters by the ratio to data parallelism's bytes, the link L given in GB/s per direction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab.fault_tolerance.bandwidth import sent_bytes_per_step, step_seconds
from distlab.style import LINES, styled


def modelled_step_seconds(sent: Mapping[str, float], compute_s: float, link_GBps: float, n_params: int,
                          replicas: int, dp: str = "dp", bytes_per_value: int = 2) -> dict[str, float]:
    """Seconds per inner step of each method, timed as if the model had `n_params` parameters: its bytes
    are data parallelism's `V_dp` times the ratio of the bytes counted on the ranks."""
    v_dp = sent_bytes_per_step("dp", n_params, replicas, bytes_per_value=bytes_per_value)
    return {name: step_seconds(compute_s, v_dp * value / sent[dp], link_GBps) for name, value in sent.items()}


def token_efficiency(losses: Sequence[float], dp_losses: Sequence[float], window: int = 4) -> float:
    """eta: the steps data parallelism needs to reach the method's final loss (smoothed over `window`
    steps), over the method's steps; at most 1."""
    smooth = np.convolve(dp_losses, np.ones(window) / window, mode="valid")
    target = float(np.mean(losses[-window:]))
    reached = np.nonzero(smooth <= target)[0]
    steps_dp = (reached[0] + window) if len(reached) else len(dp_losses)
    return min(1.0, steps_dp / len(losses))


@styled
def loss_curves(losses: Mapping[str, Sequence[float]], tokens_per_step: int,
                seconds_per_step: Mapping[str, float], title: str = "") -> Figure:
    """Two panels: mean training loss of the replicas against tokens, and against modelled seconds."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for (name, curve), colour in zip(losses.items(), LINES, strict=False):
        steps = np.arange(1, len(curve) + 1)
        left.plot(steps * tokens_per_step, curve, color=colour, label=name, lw=1.4)
        right.plot(steps * seconds_per_step[name], curve, color=colour, label=name, lw=1.4)
    left.set_xlabel("tokens (all replicas)")
    left.set_ylabel("training loss (mean of replicas)")
    right.set_xlabel("modelled wall time (s)")
    right.set_xscale("log")
    left.legend(frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@styled
def break_even_figure(n_params: int = 10**9, replicas: int = 2, compute_s: float = 1.0, sync_every: int = 100,
                      efficiency: float = 0.9) -> Figure:
    """Seconds per data-parallel step's worth of progress against link speed: data parallelism (bf16
    gradients every step) and DiLoCo (fp32 pseudo-gradients every H steps, divided by its token efficiency
    eta), with the break-even speed L* and two links from the text (10 Gb/s, one 400 Gb/s NIC)."""
    from distlab.fault_tolerance.bandwidth import break_even_GBps
    v_dp = sent_bytes_per_step("dp", n_params, replicas, bytes_per_value=2)
    v = sent_bytes_per_step("diloco", n_params, replicas, sync_every, bytes_per_value=4)
    gbps = np.logspace(-1, 3.3, 200)  # Gb/s
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(gbps, [step_seconds(compute_s, v_dp, g / 8) for g in gbps], color=LINES[0],
            label="data parallelism")
    ax.plot(gbps, [step_seconds(compute_s, v, g / 8) / efficiency for g in gbps], color=LINES[2],
            label=f"DiLoCo, H = {sync_every}, eta = {efficiency}")
    star = break_even_GBps(compute_s, v_dp, v, efficiency) * 8
    ax.axvline(star, color="black", lw=0.8, ls="--")
    ax.annotate(f"L* = {star:.0f} Gb/s", (star, ax.get_ylim()[1] * 0.6), xytext=(4, 0),
                textcoords="offset points")
    for link, name in ((10, "10 Gb/s"), (400, "400 Gb/s NIC")):
        ax.axvline(link, color="grey", lw=0.6)
        ax.annotate(name, (link, ax.get_ylim()[1] * 0.9), xytext=(3, 0), textcoords="offset points",
                    color="grey")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link speed (Gb/s, per direction)")
    ax.set_ylabel("seconds per DP step of progress")
    ax.set_title(f"N = {n_params:.0e}, R = {replicas}, c = {compute_s:g} s per step")
    ax.legend(frameon=False, loc="lower left")
    fig.tight_layout()
    return fig
