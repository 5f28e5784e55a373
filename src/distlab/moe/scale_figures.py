"""Pictures of chapter 6's sections at scale, drawn from the code they illustrate (`dispatch_cost.py`,
`aux_free.py`, `load_balance.py`, `published_counts.py`), in `distlab.style`'s colours; each closes its
figure (`style.done`)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab.moe.dispatch_cost import dispatch_time
from distlab.moe.figures import training_runs_figure
from distlab.moe.load_balance import BalanceHistory
from distlab.moe.published_counts import TABLE_HEADER, table_rows
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


def published_runs_figure() -> Figure:
    """The published MoE runs as a table drawn from `published_runs` (`published_counts.table_rows`):
    GPUs, layout, batch, the throughput each reports, experts per rank, where the ep group lies, and the
    parameters counted from each shape; "-" where the source gives nothing."""
    rows = table_rows()
    cells = [row[:-1] for row in rows]  # the source column goes into the notes below the table
    with mpl.rc_context(dict(RC)):
        table_h, notes_h = 0.3 * (len(cells) + 1), 0.17 * len(rows)
        fig, ax = plt.subplots(figsize=(13.5, table_h + notes_h + 0.4))
        ax.axis("off")
        share = table_h / (table_h + notes_h)
        table = ax.table(cellText=cells, colLabels=TABLE_HEADER[:-1], cellLoc="left",
                         bbox=(0.0, 1.0 - share, 1.0, share))
        table.auto_set_font_size(False)
        table.set_fontsize(8)
        table.auto_set_column_width(list(range(len(TABLE_HEADER) - 1)))
        for (row, _), cell in table.get_celld().items():
            cell.set_edgecolor(GREY)
            if row == 0:
                cell.set_facecolor("#e8eef7")
        sources = "\n".join(f"row {i + 1}: {row[-1]}" for i, row in enumerate(rows))
        ax.text(0.0, 1.0 - share - 0.02, sources, transform=ax.transAxes, fontsize=7, va="top",
                color="#444444")
        ax.set_title("Published MoE training runs (parameters counted from each shape, total / active)",
                     fontsize=10)
    return done(fig)
