"""Pictures of chapter 6's sections at scale, drawn from the code they illustrate (`dispatch_cost.py`,
`aux_free.py`, `load_balance.py`), in `distlab.style`'s colours; each closes its figure (`style.done`)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab.moe.dispatch_cost import dispatch_time
from distlab.moe.figures import training_runs_figure
from distlab.moe.load_balance import BalanceHistory
from distlab.style import BLUE, GREEN, GREY, LINES, RC, VERMILION, done


def dispatch_cost_figure(servers: Sequence[str] = ("DGX A100", "DGX H100"),
                         nodes: Sequence[int] = (1, 2, 4, 8, 16, 32), ks: Sequence[int] = (1, 2, 4, 8),
                         num_experts: int = 256, max_nodes: int = 4, tokens: int = 4096,
                         d_model: int = 7168) -> Figure:
    """Predicted T_flat / T_hier of one dispatch against the number of servers, one line per k, M = 4
    (capped at the servers there are), bfloat16 (`dispatch_cost.dispatch_time`)."""
    with mpl.rc_context(dict(RC)):
        fig, axes = plt.subplots(1, len(servers), figsize=(4.2 * len(servers), 3.2), sharey=True)
        for ax, server in zip(np.atleast_1d(axes), servers, strict=True):
            for colour, k in zip(LINES, ks, strict=False):
                speed = [dispatch_time(server, n, num_experts, k, tokens, d_model, 2,
                                       min(max_nodes, n)).speedup for n in nodes]
                ax.plot(nodes, speed, marker="o", color=colour, label=f"k = {k}")
            ax.axhline(1, color=GREY, lw=0.8, ls=":")
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(nodes), [str(n) for n in nodes])
            ax.set_xlabel("servers N (8 GPUs each, one rank per GPU)")
            ax.set_title(f"{server}: E = {num_experts}, M = {max_nodes}")
            ax.grid(alpha=0.3)
        np.atleast_1d(axes)[0].set_ylabel("T_flat / T_hier  (> 1: hierarchical pays)")
        np.atleast_1d(axes)[0].legend()
        fig.tight_layout()
    return done(fig)


def balancing_comparison_figure(runs: dict[str, BalanceHistory]) -> Figure:
    """Per step, the busiest expert's load over the mean and the task loss of each run in `runs`."""
    colours = (VERMILION, BLUE, GREEN) + tuple(LINES)
    return training_runs_figure([(name, colour, hist) for colour, (name, hist)
                                 in zip(colours, runs.items(), strict=False)], "task_loss",
                                "task loss (MSE)", "Task loss, without any auxiliary term", log=True)
