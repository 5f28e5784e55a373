"""The checkpoint lab's picture: the loss curve of an uninterrupted run, and the curves of the runs that
resumed from its checkpoint on other meshes, drawn over it (they should lie on top of it)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from distlab import style


def resume_figure(full: Mapping[int, float], resumed: Mapping[str, Mapping[int, float]],
                  saved_at: int) -> Figure:
    """Loss per step: `full` (the uninterrupted run) as a line, each run of `resumed` ({label: {step:
    loss}}) as markers from the step it resumed at, and the checkpoint as a vertical line."""
    with plt.rc_context(style.RC):
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        steps = sorted(full)
        ax.plot(steps, [full[s] for s in steps], color=style.COMPUTE, label="uninterrupted, dp=2 tp=2")
        markers = "os^D"
        colours = [style.COMMUNICATION, style.PASS, style.FAIL, style.IDLE]
        for i, (label, curve) in enumerate(resumed.items()):
            xs = sorted(curve)
            ax.plot(xs, [curve[s] for s in xs], linestyle="none", marker=markers[i % 4],
                    markerfacecolor="none", markersize=8 + 2 * i, color=colours[i % 4], label=label)
        ax.axvline(saved_at - 0.5, color=style.IDLE, linestyle="--",
                   label=f"checkpoint after {saved_at} steps")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.set_title("Resumed on another mesh: the same loss curve")
        ax.legend(fontsize="small")
        return style.done(fig)
