"""Pictures of chapter 6, computed by the code they illustrate (`explore.py`, `gating.py`).

Every function returns a matplotlib Figure, changes rcParams only inside `mpl.rc_context`, and closes
the figure in pyplot before returning it (`style.done`: a notebook shows it once; `savefig` still works).
Colours come from `distlab.style`: processed tokens in blue, dropped ones in vermilion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab.explorers import live_explorer
from distlab.moe.load_balance import (
    BalanceHistory,
    drop_rate_curve,
    routing_counts,
    send_matrix,
    train_balance,
)
from distlab.style import BLUE, GREEN, GREY, LINES, RC, VERMILION, done

if TYPE_CHECKING:
    import ipywidgets


def _histogram(ax, num_experts: int, k: int, capacity_factor: float, skew: float, num_tokens: int) -> float:
    wanted, kept, capacity = routing_counts(num_experts, k, capacity_factor, skew, num_tokens)
    e = np.arange(num_experts)
    ax.bar(e, kept.numpy(), color=BLUE, label="processed")
    ax.bar(e, (wanted - kept).numpy(), bottom=kept.numpy(), color=VERMILION,
           label="dropped (over capacity)")
    ax.axhline(capacity, color="black", ls="--", lw=1, label=f"capacity C = {capacity}")
    ax.axhline(k * num_tokens / num_experts, color=GREEN, ls=":", lw=1.2, label="even share kT/E")
    dropped = 1 - float(kept.sum()) / float(wanted.sum())
    ax.set_title(f"skew {skew:g}: {dropped:.0%} of assignments dropped")
    ax.set_xlabel("expert")
    ax.set_ylabel("tokens routed to the expert")
    ax.set_xticks(e)
    return dropped


def routing_histogram_figure(skews: Sequence[float] = (0.0, 1.0), num_experts: int = 8, k: int = 1,
                             capacity_factor: float = 1.25, num_tokens: int = 512) -> Figure:
    """Tokens per expert from a freshly initialised router, one panel per skew, with the capacity line."""
    with mpl.rc_context(dict(RC)):
        fig, axes = plt.subplots(1, len(skews), figsize=(4.2 * len(skews), 3.2), sharey=True, squeeze=False)
        for ax, skew in zip(axes[0], skews, strict=True):
            _histogram(ax, num_experts, k, capacity_factor, skew, num_tokens)
        axes[0][0].legend(loc="upper left")
        fig.suptitle(f"Routing {num_tokens} tokens to {num_experts} experts, k = {k}, "
                     f"capacity factor {capacity_factor:g}")
        fig.tight_layout()
    return done(fig)


def drop_rate_figure(skews: Sequence[float] = (0.0, 0.5, 1.0, 2.0), num_experts: int = 8,
                     ks: Sequence[int] = (1, 2)) -> Figure:
    """Fraction of assignments dropped against the capacity factor, per skew, for k = 1 and k = 2."""
    factors = np.round(np.arange(0.25, 3.01, 0.125), 3)
    with mpl.rc_context(dict(RC)):
        fig, axes = plt.subplots(1, len(ks), figsize=(4.2 * len(ks), 3.2), sharey=True, squeeze=False)
        for ax, k in zip(axes[0], ks, strict=True):
            for colour, skew in zip(LINES, skews, strict=False):
                ax.plot(factors, drop_rate_curve(factors.tolist(), num_experts, k, skew), color=colour,
                        label=f"skew {skew:g}")
            ax.axvline(1.0, color=GREY, lw=0.8, ls=":")
            ax.set_title(f"k = {k}, {num_experts} experts, 512 tokens")
            ax.set_xlabel("capacity factor")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("fraction of assignments dropped")
        axes[0][0].legend()
        fig.tight_layout()
    return done(fig)


def training_runs_figure(runs: Sequence[tuple[str, str, BalanceHistory]], right: str, ylabel: str,
                         title: str, log: bool = False) -> Figure:
    """Per training step of each (name, colour, history) run: the busiest expert's load over the mean
    (left), and the history's series `right` ("dropped" or "task_loss") titled `title` (right)."""
    with mpl.rc_context(dict(RC)):
        fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.2))
        for name, colour, hist in runs:
            values = getattr(hist, right)
            steps = np.arange(len(values))
            a.plot(steps, hist.imbalance().numpy(), color=colour, label=name)
            b.plot(steps, values, color=colour, label=name)
        a.axhline(1, color=GREY, lw=0.8, ls=":")
        a.set_ylabel("busiest expert / mean load")
        a.set_title("Load imbalance (1 = even)")
        b.set_ylabel(ylabel)
        if log:
            b.set_yscale("log")
        b.set_title(title)
        for ax in (a, b):
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
        a.legend()
        fig.tight_layout()
    return done(fig)


def load_balancing_figure(without: BalanceHistory | None = None, with_aux: BalanceHistory | None = None,
                          aux_weight: float = 1e-2) -> Figure:
    """The same short training run without and with the load-balancing loss: the busiest expert's load
    over the mean, and the fraction of assignments dropped, per step (runs `train_balance` if needed)."""
    without = train_balance(0.0) if without is None else without
    with_aux = train_balance(aux_weight) if with_aux is None else with_aux
    return training_runs_figure([("no aux loss", VERMILION, without),
                                 (f"aux loss x {aux_weight:g}", BLUE, with_aux)], "dropped",
                                "fraction of assignments dropped", "Tokens dropped at capacity factor 1.25")


def send_matrix_figure(skews: Sequence[float] = (0.0, 1.0), world_size: int = 4, num_experts: int = 8,
                       k: int = 2, capacity_factor: float = 1.25, tokens_per_rank: int = 128) -> Figure:
    """Rows each rank sends to each rank in the dispatch all-to-all (`send_matrix`), per skew."""
    with mpl.rc_context(dict(RC)):
        fig, axes = plt.subplots(1, len(skews), figsize=(3.6 * len(skews), 3.2), squeeze=False)
        for ax, skew in zip(axes[0], skews, strict=True):
            rows = send_matrix(num_experts, k, capacity_factor, skew, world_size, tokens_per_rank).numpy()
            ax.imshow(rows, cmap="Blues", vmin=0, vmax=k * tokens_per_rank)
            for i in range(world_size):
                for j in range(world_size):
                    ax.text(j, i, str(rows[i, j]), ha="center", va="center", fontsize=8,
                            color="white" if rows[i, j] > 0.6 * k * tokens_per_rank else "black")
            off = rows.sum() - np.trace(rows)
            ax.set_title(f"skew {skew:g}: {off} rows leave their rank")
            ax.set_xlabel("to rank (owner of the expert)")
            ax.set_ylabel("from rank")
            ax.set_xticks(range(world_size))
            ax.set_yticks(range(world_size))
        fig.suptitle(f"Dispatch all-to-all: {world_size} ranks, {num_experts} experts, k = {k}, "
                     f"{tokens_per_rank} tokens per rank")
        fig.tight_layout()
    return done(fig)


def moe_frame(experts: int = 8, k: int = 1, factor: float = 1.25, skew: float = 1.0) -> Figure:
    """What the MoE explorer shows: the routing histogram of 512 tokens and the drop rate for `experts`
    experts, top-k routing (k at most `experts`), capacity factor `factor` and router skew `skew`."""
    with mpl.rc_context(dict(RC)):
        fig, ax = plt.subplots(figsize=(6, 3.2))
        _histogram(ax, experts, min(k, experts), factor, skew, 512)
        ax.legend(loc="upper right")
        fig.tight_layout()
    return done(fig)


def moe_explorer() -> ipywidgets.VBox:
    """A widget: pick experts, k, capacity factor and skew; see the routing histogram and the drop rate
    (`moe_frame`, also the static book version over a small grid)."""
    import ipywidgets as widgets

    c = {"experts": widgets.IntSlider(value=8, min=2, max=32, description="experts E"),
         "k": widgets.IntSlider(value=1, min=1, max=4, description="k"),
         "factor": widgets.FloatSlider(value=1.25, min=0.25, max=3.0, step=0.05, description="capacity f."),
         "skew": widgets.FloatSlider(value=1.0, min=0.0, max=3.0, step=0.1, description="skew")}

    def k_at_most_experts(controls: dict) -> None:
        controls["k"].max = controls["experts"].value

    grid = {"k": [1, 2], "factor": [1.0, 1.25, 2.0], "skew": [0.0, 1.0, 2.0]}
    rows = [widgets.HBox([c["experts"], c["k"]]), widgets.HBox([c["factor"], c["skew"]])]
    return live_explorer("moe", moe_frame, c, grid, rows, k_at_most_experts)
