"""When each distributed Muon layout wins: the predicted optimizer step of (a) gather-to-owner over (b)
all-to-all, by model width and data-parallel size (`cost_model.step_seconds`)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from distlab import style
from distlab.memory.muon.cost_model import gpt_model, step_seconds
from distlab.tensor_parallel.cost_model import A100_PEAK_FLOPS, INFINIBAND_HDR

WIDTHS = (256, 512, 1024, 2048, 4096, 8192)
WORLDS = (2, 4, 8, 16, 32, 64)


def layout_ratio(width: int, world: int, n_layer: int = 12) -> float:
    """t(a) / t(b) for a GPT of `n_layer` blocks of `width`, bf16, on InfiniBand HDR (chapter 5's
    illustrative link: 5 us per hop, one port's per-direction bandwidth) and an A100's dense bf16 peak."""
    model = gpt_model(n_layer, width, 50257, 1024)
    a, b = (step_seconds(layout, model, world, INFINIBAND_HDR.alpha, INFINIBAND_HDR.beta, A100_PEAK_FLOPS)
            for layout in ("owner", "all_to_all"))
    return a / b


@style.styled
def layouts_figure() -> Figure:
    """A heat map of t(a) / t(b) over widths and world sizes: above 1, the all-to-all layout is faster."""
    ratios = np.array([[layout_ratio(w, n) for n in WORLDS] for w in WIDTHS])
    fig, ax = plt.subplots(figsize=(6.4, 4), layout="constrained")
    im = ax.imshow(ratios, origin="lower", cmap="viridis", aspect="auto", norm=LogNorm())
    for i in range(len(WIDTHS)):
        for j in range(len(WORLDS)):
            ax.text(j, i, f"{ratios[i, j]:.2f}", ha="center", va="center", fontsize=8, color="white")
    ax.set_xticks(range(len(WORLDS)), [str(n) for n in WORLDS])
    ax.set_yticks(range(len(WIDTHS)), [str(w) for w in WIDTHS])
    ax.set_xlabel("data-parallel ranks N")
    ax.set_ylabel("model width d (12 GPT blocks)")
    ax.set_title("predicted optimizer step, gather-to-owner / all-to-all", fontsize=10)
    fig.colorbar(im, ax=ax, label="t(a) / t(b), log scale")
    return fig
