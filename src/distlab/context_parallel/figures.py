"""The chapter's pictures, drawn from `cost_model` (the same schedule `ring.py` runs).

- `work_figure`: blocks of attention each rank computes, contiguous beside zig-zag (optionally with the
  counts measured on ranks drawn as markers on the bars).
- `ring_steps_figure`: for each ring step, whose K/V block each rank holds and how many blocks it
  computes with it; the arrows are the sends that overlap the step.
- `memory_figure`: predicted saved bytes of attention per rank vs sequence length, ring (p ranks) and
  unsplit attention with its L x L matrices.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab import style
from distlab.context_parallel import cost_model
from distlab.context_parallel.layouts import chunk_ids, num_chunks

LAYOUT_COLOURS = {"contiguous": style.VERMILION, "zigzag": style.BLUE}


@style.styled
def work_figure(p: int = 4, measured: dict[str, Sequence[float]] | None = None) -> Figure:
    """Score entries per rank, in units of one (L/p)^2 block, for both layouts on p ranks; `measured`
    (layout -> per-rank values in the same unit) is drawn as black markers on the bars."""
    fig = plt.figure(figsize=(6.4, 2.8))
    ax = fig.add_subplot()
    x = np.arange(p)
    width = 0.38
    for i, layout in enumerate(("contiguous", "zigzag")):
        scale = (num_chunks(p, layout) / p) ** 2  # blocks of (L / n)^2 in units of (L / p)^2
        work = np.array(cost_model.blocks_per_rank(p, layout)) / scale
        xs = x + (i - 0.5) * width
        ax.bar(xs, work, width, color=LAYOUT_COLOURS[layout],
               label=f"{layout}: max/mean = {cost_model.imbalance(p, layout):.2f}")
        if measured and layout in measured:
            ax.plot(xs, measured[layout], "k_", markersize=14, markeredgewidth=2)
    if measured:
        ax.plot([], [], "k_", markersize=10, markeredgewidth=2, label="measured on ranks")
    ax.set_xticks(x, [f"rank {r}" for r in range(p)])
    ax.set_ylabel("attention work per rank\n(blocks of (L/p)$^2$ scores)")
    ax.set_title(f"Causal attention split over p = {p} ranks: the last contiguous rank sets the pace")
    ax.legend(loc="upper left", frameon=False)
    fig.tight_layout()
    return fig


@style.styled
def ring_steps_figure(p: int = 4, layout: str = "zigzag") -> Figure:
    """One column per ring step, one row per rank: the K/V block held (by owner) and blocks computed."""
    schedule = cost_model.ring_schedule(p, layout)
    fig = plt.figure(figsize=(1.55 * p + 1.0, 0.55 * p + 1.1))
    ax = fig.add_subplot()
    most = 2 * len(chunk_ids(0, p, layout)) ** 2
    for s, row in enumerate(schedule):
        for r, (src, n) in enumerate(row):
            shade = style.COMPUTE if n else style.IDLE
            ax.add_patch(mpl.patches.Rectangle((s * 1.6, p - 1 - r), 1.0, 0.8, color=shade,
                                               alpha=0.35 + 0.65 * min(n, most) / most if n else 0.35))
            ax.text(s * 1.6 + 0.5, p - 1 - r + 0.4, f"K/V of {src}\n{n} block{'s' * (n != 1)}",
                    ha="center", va="center", fontsize=7, color="white" if n else "black")
            if s < p - 1:  # the send to the next rank that overlaps this step's compute
                ax.annotate("", xy=(s * 1.6 + 1.55, p - 1 - (r + 1) % p + 0.4),
                            xytext=(s * 1.6 + 1.02, p - 1 - r + 0.4),
                            arrowprops={"arrowstyle": "->", "color": style.COMMUNICATION, "lw": 0.9})
    ax.set_xlim(-0.1, 1.6 * p)
    ax.set_ylim(-0.2, p)
    ax.set_xticks([s * 1.6 + 0.5 for s in range(p)], [f"step {s}" for s in range(p)])
    ax.set_yticks([p - 1 - r + 0.4 for r in range(p)], [f"rank {r}" for r in range(p)])
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"Ring attention, {layout} layout, p = {p}: compute (blue) while K/V moves on (orange)")
    fig.tight_layout()
    return fig


@style.styled
def memory_figure(seq_lens: Sequence[int] = (1024, 4096, 16384, 65536, 131072),
                  ps: Sequence[int] = (1, 4, 16),
                  batch: int = 1, heads: int = 32, head_dim: int = 128, dtype_bytes: int = 2) -> Figure:
    """Predicted saved bytes of attention per rank vs L: ring attention on p ranks (linear in L/p) and
    unsplit attention that keeps the L x L matrices (quadratic). Example shape: 32 heads of 128."""
    fig = plt.figure(figsize=(6.0, 3.0))
    ax = fig.add_subplot()
    L = np.array(seq_lens)
    dense = [cost_model.dense_attention_saved_bytes(n, batch, heads, head_dim, dtype_bytes) for n in L]
    ax.loglog(L, np.array(dense) / 2**30, "--", color=style.GREY, label="unsplit, L x L kept (math)")
    for colour, p in zip(style.LINES, ps, strict=False):
        ring = [cost_model.attention_saved_bytes(p, n, batch, heads, head_dim, dtype_bytes, 4) for n in L]
        ax.loglog(L, np.array(ring) / 2**30, "o-", color=colour, label=f"ring attention, p = {p}")
    ax.set_xlabel("sequence length L (tokens)")
    ax.set_ylabel("saved for backward per rank (GiB)")
    ax.set_title(f"One attention layer, b = {batch}, {heads} heads x {head_dim}, {8 * dtype_bytes}-bit: "
                 "predicted", fontsize=8)
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


@style.styled
def ulysses_vs_ring_figure(seq_len: int = 131072,
                           heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
                           cps: Sequence[int] = (2, 4, 8, 16, 32, 64), node: int = 8) -> Figure:
    """Left: bytes each rank sends per attention layer (forward + backward) vs the cp size, ring (Liu et
    al. 2023), Ulysses (Jacobs et al. 2023; only where the kv heads divide) and the hybrid (Fang & Zhao
    2024, Ulysses over min(cp, node) ranks, ring over the rest), as fractions of the layer's K and V.
    Right: predicted seconds per layer on DGX H100 nodes (catalog: H100 dense BF16 flops, NVLink 4 per
    direction inside a node, one 400 Gb/s NIC per GPU across), compute and exposed communication."""
    from distlab import catalog

    gpu, server = catalog.lookup("gpu", "H100"), catalog.lookup("server", "DGX H100")
    intra = catalog.lookup("nvlink", gpu.nvlink).gpu_GBps_per_direction
    inter = server.nic_GBps_per_direction
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.4))
    shape = {"seq_len": seq_len, "batch": 1, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
             "dtype_bytes": 2}
    _traffic_panel(ax, shape, cps, node)
    _time_panel(bx, {**shape, "flops_per_s": gpu.dense_16bit_tflops * 1e12}, cps, node, intra, inter)
    fig.tight_layout()
    return fig


def _traffic_panel(ax: mpl.axes.Axes, shape: dict, cps: Sequence[int], node: int) -> None:
    """The left panel: bytes each rank sends per layer, fwd + bwd, in units of the layer's K and V."""
    seq_len, b, heads, kv_heads = shape["seq_len"], shape["batch"], shape["heads"], shape["kv_heads"]
    head_dim, e = shape["head_dim"], shape["dtype_bytes"]
    kv_total = 2 * b * kv_heads * seq_len * head_dim * e  # the layer's K and V, all tokens
    x = np.array(cps)
    ring = [sum(cost_model.hybrid_bytes_per_rank(1, p, seq_len, b, heads, kv_heads, head_dim, e).values())
            - cost_model.hybrid_bytes_per_rank(1, p, seq_len, b, heads, kv_heads, head_dim, e)["ulysses"]
            for p in cps]
    uly_ps = [p for p in cps if kv_heads % p == 0]
    uly = [2 * cost_model.ulysses_bytes_per_rank(p, seq_len, b, heads, kv_heads, head_dim, e)["forward"]
           for p in uly_ps]
    hyb = [_hybrid_bytes(min(p, node), max(1, p // node), shape) for p in cps]
    ax.plot(x, np.array(ring) / kv_total, "o-", color=style.VERMILION, label="ring")
    ax.plot(uly_ps, np.array(uly) / kv_total, "s-", color=style.BLUE,
            label=f"Ulysses (cp divides {kv_heads} kv heads)")
    ax.plot(x, np.array(hyb) / kv_total, "^--", color=style.GREEN, label=f"hybrid: Ulysses {node} x ring")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cp size (ranks)")
    ax.set_ylabel("bytes sent per rank, fwd + bwd\n(in units of the layer's K and V)")
    ax.set_title(f"Per-rank traffic, L={seq_len // 1024}K, {heads} heads / {kv_heads} kv heads")
    ax.legend(frameon=False, fontsize=7)


def _hybrid_bytes(u: int, r: int, shape: dict) -> int:
    """Bytes one rank sends per layer, fwd + bwd, under the hybrid: Ulysses over u ranks, ring over r."""
    h = cost_model.hybrid_bytes_per_rank(u, r, shape["seq_len"], shape["batch"], shape["heads"],
                                         shape["kv_heads"], shape["head_dim"], shape["dtype_bytes"])
    return 2 * h["ulysses"] + h["ring_forward"] + h["ring_backward"]


def _time_panel(bx: mpl.axes.Axes, kw: dict, cps: Sequence[int], node: int, intra: float,
                inter: float) -> None:
    """The right panel: predicted ms per layer (total and exposed communication) on DGX H100 nodes."""
    x = np.array(cps)
    uly_ps = [p for p in cps if kw["kv_heads"] % p == 0]
    link = {p: intra if p <= node else inter for p in cps}  # a ring of up to one node stays on NVLink
    rows = [("ring", [cost_model.cp_attention_time("ring", r=p, intra_GBps=link[p], **kw) for p in cps], x,
             style.VERMILION),
            ("Ulysses", [cost_model.cp_attention_time("ulysses", u=p, intra_GBps=intra, **kw)
                         for p in uly_ps], np.array(uly_ps), style.BLUE),
            ("hybrid", [cost_model.cp_attention_time("hybrid", u=min(p, node), r=max(1, p // node),
                                                     intra_GBps=intra, inter_GBps=inter, **kw) for p in cps],
             x, style.GREEN)]
    for name, times, xs, colour in rows:
        bx.plot(xs, [t["total"] * 1e3 for t in times], "o-", color=colour, label=f"{name}: total")
        bx.plot(xs, [t["exposed"] * 1e3 for t in times], ":", color=colour, label=f"{name}: exposed comm")
    bx.set_xscale("log", base=2)
    bx.set_yscale("log")
    bx.set_xlabel("cp size (ranks; ring across nodes of 8)")
    bx.set_ylabel("predicted ms per layer (fwd + bwd)")
    bx.set_title(f"DGX H100: NVLink {intra:g} GB/s, NIC {inter:g} GB/s per direction", fontsize=8)
    bx.legend(frameon=False, fontsize=6.5, ncol=2)


@style.styled
def ulysses_measured_figure(measured: Sequence[dict]) -> Figure:
    """The lab's runs of `ulysses_vs_ring.measure` (one dict per cp size): bytes sent per rank (counted
    by comm_log, with the model's as black ticks) and seconds of forward + backward (measured, with the
    model calibrated on the same machine as black ticks), ring beside Ulysses."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.0))
    width = 0.38
    x = np.arange(len(measured))
    for i, (scheme, colour) in enumerate((("ring", style.VERMILION), ("ulysses", style.BLUE))):
        xs = x + (i - 0.5) * width
        sent = [sum(m[scheme]["sent"].values()) / 2**10 for m in measured]
        model = [sum(m[scheme]["model_bytes"].values()) / 2**10 for m in measured]
        ax.bar(xs, sent, width, color=colour, label=f"{scheme} (comm_log)")
        ax.plot(xs, model, "k_", markersize=14, markeredgewidth=2)
        bx.bar(xs, [m[scheme]["seconds"] * 1e3 for m in measured], width, color=colour, label=scheme)
        bx.plot(xs, [m[scheme]["model_seconds"] * 1e3 for m in measured], "k_", markersize=14,
                markeredgewidth=2)
    for axis in (ax, bx):
        axis.set_xticks(x, [f"p = {m['p']}" for m in measured])
        axis.plot([], [], "k_", markersize=10, markeredgewidth=2, label="model")
        axis.legend(frameon=False, fontsize=7)
    ax.set_ylabel("KiB sent per rank, fwd + bwd")
    bx.set_ylabel("ms per forward + backward")
    L = measured[0]["seq_len"]
    ax.set_title(f"Bytes: measured = model (L = {L})")
    bx.set_title("Time on this machine (gloo, CPU): measured vs calibrated model", fontsize=8)
    fig.tight_layout()
    return fig
