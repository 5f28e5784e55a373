"""The FP8 section's pictures, drawn from the code they illustrate: `speedup_figure` (the cost model's
FP8-over-bf16 speedup of a linear layer against its size, casts included) and `formats_figure` (every
positive number of E4M3 and E5M2, from their bit layouts)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab import kernel_rates, style
from distlab.memory.fp8 import cost_model
from distlab.memory.fp8.formats import E4M3, E5M2


def _finish(fig: Figure, ax, xlabel: str, ylabel: str, title: str) -> Figure:
    """The speed-up figures' common ending: d on a log2 axis, labels, legend, the course's style."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    style.done(fig)
    plt.close(fig)
    return fig


def speedup_figure(gpu: str = "H100", tokens: int = 8192) -> Figure:
    """Predicted t_bf16 / t_fp8 of a square d x d weight applied to `tokens` tokens and of a d x d x d
    matmul, with current and delayed scaling, against d."""
    d = 2.0 ** np.arange(6, 16.01, 0.25)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for scaling, colour in (("current", style.BLUE), ("delayed", style.ORANGE)):
        ax.plot(d, [cost_model.speedup(x, x, x, gpu, scaling, "roofline") for x in d], color=colour,
                label=f"d x d x d, {scaling} scaling")
        ax.plot(d, [cost_model.speedup(tokens, x, x, gpu, scaling, "roofline") for x in d], color=colour,
                ls="--",
                label=f"{tokens} tokens x d x d, {scaling} scaling")
    ax.axhline(1, color=style.VERMILION, lw=1)
    ax.text(d[0], 1.04, "FP8 pays above this line", fontsize=8, color=style.VERMILION)
    return _finish(fig, ax, "matrix size d", "predicted speedup of FP8 over bf16",
                   f"When FP8 pays on an {gpu}: a roofline with the cast of both operands")


def measured_speedup_figure(gpu: str = "H200") -> Figure:
    """FP8-over-bf16 speed-up of a d x d x d product with both casts against d: what this course's code
    measured on an H200 (`kernel_rates.H200_FP8_SPEEDUP`, issue 35), chapter 7's roofline from the peaks,
    and the model with measured GEMM efficiency and cast cost (`cost_model`, model="measured"), each
    model's break-even marked."""
    d = 2.0 ** np.arange(9, 15.01, 0.125)
    measured = np.array(kernel_rates.H200_FP8_SPEEDUP)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for model, colour, label in (("roofline", style.ORANGE, "roofline from the peaks"),
                                 ("measured", style.BLUE, "measured GEMM efficiency and cast cost")):
        ax.plot(d, [cost_model.speedup(x, x, x, gpu, model=model) for x in d], color=colour,
                label=f"predicted: {label}")
        even = cost_model.break_even(gpu, model=model)
        ax.axvline(even, color=colour, lw=0.8, ls=":")
        ax.text(even * 1.04, 0.05, f"{even:,.0f}", color=colour, fontsize=8)
    ax.scatter(measured[:, 0], measured[:, 1], color="#000000", zorder=3, label=f"measured on one {gpu}")
    ax.axhline(1, color=style.VERMILION, lw=1)
    return _finish(fig, ax, "matrix size d (d x d x d, both casts included)", "FP8 speed-up over bf16",
                   f"FP8 on an {gpu}: predicted beside measured")


def formats_figure() -> Figure:
    """Every positive finite number of E4M3 and E5M2 on a log axis: E4M3 dense and short, E5M2 sparse and
    long; the subnormals in a lighter shade."""
    fig, ax = plt.subplots(figsize=(7, 2.4))
    for y, fmt, colour in ((1, E4M3, style.BLUE), (0, E5M2, style.ORANGE)):
        v = np.array(fmt.finite_values()[1:])
        sub = v < fmt.min_normal
        ax.scatter(v[~sub], np.full((~sub).sum(), y), marker="|", s=120, color=colour)
        ax.scatter(v[sub], np.full(sub.sum(), y), marker="|", s=120, color=colour, alpha=0.35)
        ax.text(fmt.max * 1.6, y, f"{fmt.name}: max {fmt.max:g}, step 2^-{fmt.mantissa_bits}",
                va="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yticks([0, 1], ["E5M2", "E4M3"])
    ax.set_ylim(-0.7, 1.7)
    ax.set_xlim(2.0**-17, 2.0**26)
    ax.set_xlabel("value (subnormals lighter)")
    ax.set_title("The positive numbers of the two FP8 formats")
    style.done(fig)
    plt.close(fig)
    return fig
