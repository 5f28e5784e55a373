"""The chapter's pictures, each drawn from the code it illustrates, and the estimator's explorer.

Book figures (registered in `distlab.figures`) are predictions or deterministic runs, never timings:
`breakdown_figure` (the estimator on a GPT-3-sized model under several configurations),
`activations_vs_seq_figure` (Korthikanti et al.'s per-layer bytes vs sequence length, per recomputation
policy), `recompute_tradeoff_figure` (bytes kept vs FLOPs recomputed), `loss_scale_figure` (the dynamic
loss scale of a forced-overflow run) and `underflow_figure` (gradients that fp16 flushes to zero).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from distlab import style
from distlab.explorers import live_explorer
from distlab.memory.estimate import cost_model, estimator
from distlab.memory.techniques import precision, recompute
from distlab.models import GPT, GPTConfig

KINDS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
KIND_COLOURS = (style.BLUE, style.SKY_BLUE, style.ORANGE, style.GREEN)
GPT3 = {
    "layers": 96,
    "hidden": 12288,
    "heads": 96,
    "vocab": 50257,
    "seq": 2048,
}  # Brown et al. 2020, Table 2.1

# One bar per configuration; every label differs (two bars labelled alike would be drawn as one stack).
BREAKDOWN = (
    ("DP 64", {"dp": 64}),
    ("DP 64\n+ ZeRO-1", {"dp": 64, "zero": 1}),
    ("DP 64\n+ ZeRO-3", {"dp": 64, "zero": 3}),
    ("DP 64, ZeRO-3\n+ full recompute", {"dp": 64, "zero": 3, "recompute": "full"}),
    ("TP 8, PP 8,\nDP 16", {"tp": 8, "pp": 8, "dp": 16}),
    ("TP, PP, DP\n+ SP, selective",
     {"tp": 8, "pp": 8, "dp": 16, "sequence_parallel": True, "recompute": "selective"}),
    (
        "TP, PP, DP, SP,\nselective + ZeRO-1",
        {"tp": 8, "pp": 8, "dp": 16, "sequence_parallel": True, "recompute": "selective", "zero": 1},
    ),
)


def stacked_bars(ax: plt.Axes, labels: Sequence[str], estimates: Sequence[estimator.MemoryEstimate]) -> None:
    """One stacked bar per estimate, at its own position (so equal labels can never share a bar)."""
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for kind, colour in zip(KINDS, KIND_COLOURS, strict=True):
        values = np.array([getattr(e, kind) / 1e9 for e in estimates])
        ax.bar(x, values, bottom=bottom, color=colour, label=kind.removesuffix("_bytes"))
        bottom += values
    ax.set_xticks(x, labels)
    ax.set_ylabel("GB per GPU")


def breakdown_figure() -> Figure:
    """Predicted bytes per GPU of GPT-3 175B (micro-batch 1, mixed precision) under seven configurations."""
    estimates = [estimator.estimate(estimator.MemoryConfig(**GPT3, **kw)) for _, kw in BREAKDOWN]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    stacked_bars(ax, [label for label, _ in BREAKDOWN], estimates)
    ax.set_yscale("log")
    ax.axhline(80, color=style.VERMILION, ls="--", lw=1)
    ax.text(
        len(BREAKDOWN) - 0.5, 80 * 1.15, "80 GB (one H100)", ha="right", fontsize=8, color=style.VERMILION
    )
    ax.set_title("GPT-3 175B, b = 1, s = 2048: predicted memory per GPU", pad=24)
    ax.tick_params(axis="x", labelsize=7)
    # The legend sits between the title and the axes, where no bar can be.
    ax.legend(fontsize=8, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    plt.close(fig)
    return fig


def activations_vs_seq_figure(
    h: int = 4096, a: int = 32, b: int = 1, seqs: Sequence[int] = (512, 1024, 2048, 4096, 8192)
) -> Figure:
    """Per-layer activation bytes vs sequence length, 16-bit with dropout (Korthikanti et al. 2022)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for policy, colour in zip(cost_model.RECOMPUTE, (style.VERMILION, style.BLUE, style.GREEN), strict=True):
        ys = [cost_model.layer_bytes(s, b, h, a, recompute=policy) / 2**30 for s in seqs]
        ax.plot(seqs, ys, "o-", color=colour, label=policy)
    ys = [cost_model.layer_bytes(s, b, h, a, attention="flash") / 2**30 for s in seqs]
    ax.plot(seqs, ys, "s--", color=style.ORANGE, label="none, flash attention")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length s")
    ax.set_ylabel("GiB per layer")
    ax.set_title(f"Activations of one layer: h = {h}, a = {a}, b = {b}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def recompute_tradeoff_figure(
    n_layer: int = 16, n_embd: int = 1024, n_head: int = 16, seq: int = 2048, batch: int = 1
) -> Figure:
    """Bytes the layers keep vs FLOPs recomputed, per policy, and the cost-aware plans at several budgets
    (math attention, 16-bit)."""
    config = GPTConfig(vocab_size=32000, block_size=seq, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    cost = {
        name: recompute.plan_cost(config, batch, seq, recompute.policy_plan(name, n_layer), "math", 2)
        for name in cost_model.RECOMPUTE
    }
    keep_all = cost["none"][0]
    budgets = np.linspace(cost["full"][0] * 1.01, keep_all, 12)
    aware = [
        recompute.plan_cost(
            config, batch, seq, recompute.plan_for_budget(config, batch, seq, bud, "math", 2), "math", 2
        )
        for bud in budgets
    ]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(
        [c[1] / 1e12 for c in aware],
        [c[0] / 2**30 for c in aware],
        "o-",
        color=style.BLUE,
        label="cost-aware plan, budgets",
    )
    for (name, (kept, flops)), colour in zip(
        cost.items(), (style.VERMILION, style.GREEN, style.PURPLE), strict=True
    ):
        ax.plot(flops / 1e12, kept / 2**30, "D", ms=8, color=colour, label=name)
    ax.set_xlabel("forward TFLOPs recomputed per step")
    ax.set_ylabel("GiB kept by the layers")
    ax.set_title(f"L = {n_layer}, h = {n_embd}, a = {n_head}, s = {seq}, b = {batch}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def loss_scale_figure(steps: int = 12, init_scale: float = 2.0**24, growth_interval: int = 3) -> Figure:
    """The dynamic loss scale of `precision.compare_with_grad_scaler`'s run, skipped steps marked."""
    run = precision.compare_with_grad_scaler(steps, init_scale, growth_interval)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    t = np.arange(steps)
    ax.step(t, np.log2(run["scales"]), where="post", color=style.BLUE, label="log2 of the scale")
    bad = [i for i in t if run["skipped"][i]]
    ax.plot(
        bad, np.log2(np.array(run["scales"])[bad]), "x", color=style.FAIL, ms=9, label="skipped (inf/NaN)"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("log2 S")
    ax.set_title(f"Dynamic loss scaling, fp16 autocast, growth_interval = {growth_interval}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def small_gpt_gradients(seed: int = 0) -> torch.Tensor:
    """The fp32 gradients of one step of a small GPT (2 layers, h = 32) on the arithmetic corpus."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=12, block_size=16, n_layer=2, n_head=2, n_embd=32))
    x = torch.randint(12, (8, 16), generator=torch.Generator().manual_seed(seed))
    model(x, x.roll(-1, dims=1))[1].backward()
    return precision.gradient_magnitudes(model)


def underflow_figure(scale: float = 2.0**16) -> Figure:
    """Histogram of log2 |g| of a small GPT's gradients, with fp16's smallest normal and subnormal numbers:
    left of 2^-24 a gradient becomes 0; scaling by S moves the whole histogram right by log2 S."""
    g = small_gpt_gradients()
    logs = np.log2(g[g != 0].abs().numpy())
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    bins = np.arange(np.floor(logs.min()), np.ceil(logs.max() + np.log2(scale)) + 1)
    ax.hist(logs, bins=bins, color=style.GREY, alpha=0.8, label="scale 1")
    ax.hist(
        logs + np.log2(scale), bins=bins, color=style.BLUE, alpha=0.6, label=f"scale 2^{np.log2(scale):.0f}"
    )
    for x, text in (
        (-24, "2^-24: smallest subnormal"),
        (-14, "2^-14: smallest normal"),
        (16, "65504: overflow"),
    ):
        ax.axvline(x, color=style.VERMILION, ls="--", lw=1)
        ax.text(x + 0.3, ax.get_ylim()[1] * 0.9, text, rotation=90, va="top", fontsize=7)
    f1, fs = precision.underflow_fraction(g, 1.0), precision.underflow_fraction(g, scale)
    ax.set_title(
        f"fp16 flushes {f1:.2%} of these gradients to 0 at scale 1, {fs:.2%} at the scale shown", fontsize=9
    )
    ax.set_xlabel("log2 |gradient|")
    ax.set_ylabel("count")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    plt.close(fig)
    return fig


def microbatch_figure(
    micro_batches: Sequence[int], measured: Sequence[int], predicted: Sequence[float]
) -> Figure:
    """Measured peak bytes of an accumulated step vs micro-batch size, beside the model states plus one
    micro-batch's predicted activations."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.plot(micro_batches, np.array(measured) / 2**20, "o-", color=style.BLUE, label="measured peak")
    ax.plot(
        micro_batches,
        np.array(predicted) / 2**20,
        "s--",
        color=style.ORANGE,
        label="predicted model states + activations",
    )
    ax.set_xlabel("micro-batch size (same global batch)")
    ax.set_ylabel("MiB")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def estimator_frame(**settings: object) -> list[tuple[str, str]]:
    """What the memory explorer shows: `estimator.estimate` of GPT-3 with 8 micro-batches and `settings`
    (dp, tp, pp, zero, recompute, schedule, micro_batch, offload), per kind of memory in GB, as
    (label, value) rows; a setting the estimator rejects gives one row that says why."""
    try:
        e = estimator.estimate(estimator.MemoryConfig(**GPT3, **settings, microbatches=8))
    except ValueError as err:
        return [("cannot estimate", str(err))]
    return [(k.removesuffix("_bytes"), _gb(getattr(e, k))) for k in (*KINDS, "total_bytes", "host_bytes")]


def _gb(nbytes: float) -> str:
    """Bytes as GB, one decimal from 1 GB up and two significant digits below (ZeRO-3 over 128 ranks leaves
    each rank 0.044 GB of parameters, not "0.0 GB")."""
    gb = nbytes / 1e9
    return f"{gb:,.1f} GB" if gb >= 1 or gb == 0 else f"{gb:.2g} GB"


def estimator_explorer():  # -> ipywidgets.Widget
    """Sliders for the estimator: GPT-3's shape, dp, tp, pp, ZeRO stage, recomputation, offload
    (`estimator_frame`, also the static book version over a small grid)."""
    import ipywidgets as w

    controls = {
        "dp": w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128], value=16, description="dp"),
        "tp": w.Dropdown(options=[1, 2, 4, 8], value=8, description="tp"),
        "pp": w.Dropdown(options=[1, 2, 4, 8, 16], value=8, description="pp"),
        "zero": w.Dropdown(options=[0, 1, 2, 3], value=1, description="ZeRO"),
        "recompute": w.Dropdown(
            options=list(cost_model.RECOMPUTE), value="selective", description="recompute"
        ),
        "schedule": w.Dropdown(options=list(estimator.SCHEDULES[:2]), value="1f1b", description="schedule"),
        "micro_batch": w.IntSlider(value=1, min=1, max=8, description="micro-batch"),
        "offload": w.Checkbox(value=False, description="offload optimizer"),
    }
    grid = {"dp": [1, 16, 128], "zero": [0, 1, 2, 3], "recompute": list(cost_model.RECOMPUTE)}
    rows = [w.HBox(list(controls.values())[:4]), w.HBox(list(controls.values())[4:])]
    return live_explorer("memory-estimator", estimator_frame, controls, grid, rows)
