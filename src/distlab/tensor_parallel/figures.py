"""The pictures of chapter 5, each computed from the code it illustrates.

- `split_figure`: which rank holds which block of X, A and Y = X A, for the column and the row split;
  the ownership is read off `shard_rows` / `shard_cols` applied to a matrix of indices.
- `qkv_shard_figure`: which rows of the packed c_attn weight each rank receives from `shard_state_dict`,
  beside the naive split of the packed matrix.
- `comm_volume_figure`: bytes per rank per layer (`cost_model.layer_wire_bytes`) against hidden size,
  sequence length and tensor-parallel size, with a pipeline stage's bytes for comparison.
- `link_time_figure`: communication time per layer on NVLink and on InfiniBand (ring cost model of
  chapter 1) against the layer's compute time, for growing tensor-parallel size.
- `sequence_parallel_figure`: which dimension each region of a layer splits under sequence parallelism.

Colours come from `distlab.style` (rank r is `RANK_COLOURS[r]`, grey is "every rank"); every figure is
drawn inside `style.RC` and detached from pyplot with `style.done`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from distlab import style
from distlab.explorers import live_explorer
from distlab.models import GPTConfig
from distlab.tensor_parallel import cost_model
from distlab.tensor_parallel.layers import shard_cols, shard_rows
from distlab.tensor_parallel.model import shard_state_dict


def _new_figure(**kwargs) -> Figure:
    return plt.figure(**kwargs)


RANK_COLOURS = (style.BLUE, style.ORANGE, style.GREEN, style.PURPLE, style.SKY_BLUE, style.VERMILION,
                style.YELLOW)
REPLICATED = style.GREY


def _owners(shape: tuple[int, int], shard, p: int) -> np.ndarray:
    """owner[i, j] = the rank whose shard (from `shard(index_matrix, rank, p)`) holds element (i, j)."""
    idx = torch.arange(shape[0] * shape[1]).view(shape)
    owner = np.full(shape, -1)
    for r in range(p):
        for k in shard(idx, r, p).reshape(-1).tolist():
            owner[k // shape[1], k % shape[1]] = r
    return owner


def _draw(ax, owner: np.ndarray, p: int, title: str) -> None:
    colours = ListedColormap([REPLICATED, *RANK_COLOURS[:p]])
    ax.imshow(owner + 1, cmap=colours, vmin=0, vmax=p, aspect="equal")
    ax.set_xticks(np.arange(-0.5, owner.shape[1], 1), minor=True)
    ax.set_yticks(np.arange(-0.5, owner.shape[0], 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    ax.set_title(title, fontsize=10)


@style.styled
def split_figure(p: int = 4, rows: int = 4, inner: int = 8, cols: int = 8) -> Figure:
    """Y = X A split two ways over p ranks: colour = the rank holding the block, grey = every rank.

    Column split: A = W^T keeps the rows of nn.Linear's W per rank (`shard_rows`), X is replicated, each
    rank computes its columns of Y. Row split: A keeps W's columns (`shard_cols`), X is split the same
    way, each rank computes a full-size partial sum, and g adds them.
    """
    fig = _new_figure(figsize=(10, 5.2), layout="constrained")
    axes = fig.subplots(2, 3, gridspec_kw={"width_ratios": [inner, cols, cols]})
    everyone = np.full((rows, inner), -1)
    a_col = _owners((cols, inner), shard_rows, p).T  # W is (out, in); A = W^T is (in, out)
    y_col = _owners((rows, cols), shard_cols, p)
    _draw(axes[0, 0], everyone, p, "X (b x h): replicated")
    _draw(axes[0, 1], a_col, p, "A split by columns")
    _draw(axes[0, 2], y_col, p, "Y = X A_r: columns per rank")
    x_row = _owners((rows, inner), shard_cols, p)
    a_row = _owners((cols, inner), shard_cols, p).T
    _draw(axes[1, 0], x_row, p, "X split by columns")
    _draw(axes[1, 1], a_row, p, "A split by rows")
    _draw(axes[1, 2], np.full((rows, cols), -1), p, "Y = g(sum_r X_r A_r): replicated")
    axes[0, 0].set_ylabel("column-parallel\n(f before)", fontsize=10)
    axes[1, 0].set_ylabel("row-parallel\n(g after)", fontsize=10)
    handles = [Patch(color=RANK_COLOURS[r], label=f"rank {r}") for r in range(p)]
    handles.append(Patch(color=REPLICATED, label="every rank"))
    fig.legend(handles=handles, loc="outside lower center", ncol=p + 1, fontsize=9)
    fig.suptitle(f"Splitting Y = X A over p = {p} ranks: who holds which block")
    return fig


@style.styled
def qkv_shard_figure(n_head: int = 4, p: int = 2, head_size: int = 2) -> Figure:
    """Rows of the packed c_attn weight [q | k | v] (3h x h) given to each rank: by heads within q, k
    and v (`shard_state_dict`, right), and by naive contiguous blocks of the packed matrix (wrong)."""
    h = n_head * head_size
    config = GPTConfig(vocab_size=p, n_head=n_head, n_embd=h, n_layer=1)
    rows = torch.arange(3 * h).unsqueeze(1).double()
    right = np.full(3 * h, -1)
    for r in range(p):
        got = shard_state_dict({"h.0.attn.c_attn.weight": rows}, config, r, p)["h.0.attn.c_attn.weight"]
        right[got.long().view(-1).numpy()] = r
    naive = _owners((3 * h, 1), shard_rows, p)[:, 0]
    fig = _new_figure(figsize=(9, 2.4), layout="constrained")
    ax = fig.subplots()
    _draw(ax, np.stack([right, naive]), p, "")
    ax.set_yticks([0, 1], ["by heads (right)", "naive (wrong)"])
    ax.tick_params(labelleft=True)
    for i, name in enumerate("qkv"):
        ax.axvline(i * h - 0.5, color="black", linewidth=2.5)
        ax.text(i * h + h / 2 - 0.5, -0.75, name, ha="center", va="bottom", fontsize=12)
    for col in range(0, 3 * h, head_size):
        for row in (0, 1):
            ax.text(col + head_size / 2 - 0.5, row, f"head {(col % h) // head_size}", ha="center",
                    va="center", fontsize=7, color="white")
    ax.set_xlabel("row of the packed weight (3 n_embd rows; each head owns head_size rows of q, of k, of v)")
    handles = [Patch(color=RANK_COLOURS[r], label=f"rank {r}") for r in range(p)]
    fig.legend(handles=handles, loc="outside right center", fontsize=9)
    fig.suptitle(f"Rows of c_attn's weight per rank: n_head = {n_head}, p = {p}")
    return fig


@style.styled
def comm_volume_figure(batch: int = 1, seq: int = 2048, hidden: int = 12288, p: int = 8,
                       dtype_bytes: int = 2) -> Figure:
    """Bytes each rank sends per transformer layer (forward + backward, ring algorithms) as one of
    hidden size, sequence length and TP size varies, the others fixed; a pipeline stage's bytes per
    micro-batch (`pipeline_stage_bytes`) for comparison."""
    fig = _new_figure(figsize=(11, 3.6), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    sweeps = (("hidden size h", np.array([1024, 2048, 4096, 8192, 12288, 16384, 20480]), "hidden"),
              ("sequence length s (tokens)", np.array([256, 512, 1024, 2048, 4096, 8192]), "seq"),
              ("tensor-parallel size p", np.array([2, 4, 8, 16, 32, 64]), "p"))
    for ax, (label, xs, which) in zip(axes, sweeps, strict=True):
        args = [{"batch": batch, "seq": seq, "hidden": hidden, "p": p} | {which: int(x)} for x in xs]
        tp = [cost_model.layer_wire_bytes(a["batch"], a["seq"], a["hidden"], a["p"], dtype_bytes)
              for a in args]
        pp = [cost_model.pipeline_stage_bytes(a["batch"], a["seq"], a["hidden"], dtype_bytes) for a in args]
        ax.plot(xs, np.array(tp) / 1e6, "o-", color=style.COMMUNICATION, label="tensor parallel, per layer")
        ax.plot(xs, np.array(pp) / 1e6, "s--", color=style.SKY_BLUE, label="pipeline, per stage boundary")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("MB sent per rank (fwd + bwd)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Communication per micro-batch: b = {batch}, defaults s = {seq}, h = {hidden}, p = {p}, "
                 f"{dtype_bytes}-byte elements")
    return fig


@style.styled
def link_time_figure(batch: int = 1, seq: int = 2048, hidden: int = 12288,
                     peak_flops: float = cost_model.A100_PEAK_FLOPS) -> Figure:
    """Per-layer time against TP size p: compute at peak (`layer_flops` / p / peak) and the ring
    all-reduces over NVLink and over one InfiniBand port (illustrative links, `cost_model`)."""
    ps = np.array([2, 4, 8, 16, 32, 64])
    compute = [cost_model.layer_flops(batch, seq, hidden) / p / peak_flops for p in ps]
    fig = _new_figure(figsize=(6.4, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot(ps, np.array(compute) * 1e3, "-o", color=style.COMPUTE, label="compute at peak (per GPU)")
    links = ((cost_model.NVLINK_A100, "NVLink, 300 GB/s each way", style.ORANGE),
             (cost_model.INFINIBAND_HDR, "InfiniBand HDR, 25 GB/s each way", style.VERMILION))
    for machine, name, colour in links:
        t = [cost_model.layer_time(batch, seq, hidden, int(p), machine) for p in ps]
        ax.plot(ps, np.array(t) * 1e3, "o--", color=colour, label=f"TP all-reduces over {name}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tensor-parallel size p")
    ax.set_ylabel("time per layer, fwd + bwd (ms)")
    ax.set_title(f"One layer, b = {batch}, s = {seq}, h = {hidden}, bf16 (illustrative)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


@style.styled
def sequence_parallel_figure(p: int = 2) -> Figure:
    """One transformer layer under sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2): which
    dimension each region splits over p ranks, and the collective on each boundary (forward; backward
    swaps all-gather and reduce-scatter). Plain tensor parallelism puts f and g on the same boundaries."""
    regions = [("LayerNorm", "sequence"), ("attention\n(c_attn, heads, c_proj)", "heads"),
               ("dropout +\nresidual, LayerNorm", "sequence"), ("MLP\n(c_fc, GELU, c_proj)", "ffn columns"),
               ("dropout +\nresidual", "sequence")]
    boundaries = ["all-gather\n(f in TP)", "reduce-scatter\n(g in TP)", "all-gather\n(f in TP)",
                  "reduce-scatter\n(g in TP)"]
    fig = _new_figure(figsize=(11, 3), layout="constrained")
    ax = fig.subplots()
    width, gap = 1.6, 0.9
    for i, (name, split) in enumerate(regions):
        x = i * (width + gap)
        seq = split == "sequence"
        for r in range(p):  # one stripe per rank: rows = positions of the sequence, columns = features
            if seq:
                ax.add_patch(plt_rect((x, 1.1 - (r + 1) * 0.9 / p), width, 0.9 / p - 0.03,
                                      RANK_COLOURS[r], 0.85))
            else:
                ax.add_patch(plt_rect((x + r * width / p, 0.2), width / p - 0.03, 0.9, RANK_COLOURS[r], 0.85))
        ax.text(x + width / 2, 1.25, name, ha="center", va="bottom", fontsize=9)
        ax.text(x + width / 2, 0.05, f"split by {split}", ha="center", va="top", fontsize=8, style="italic")
        if i < len(boundaries):
            ax.annotate("", (x + width + gap - 0.05, 0.65), (x + width + 0.05, 0.65),
                        arrowprops={"arrowstyle": "-|>", "color": "black"})
            ax.text(x + width + gap / 2, 0.75, boundaries[i], ha="center", va="bottom", fontsize=7.5)
    ax.text(-0.15, 0.65, "sequence\n(tokens)", ha="right", va="center", fontsize=8, rotation=90)
    ax.set_xlim(-0.5, len(regions) * (width + gap) - gap + 0.2)
    ax.set_ylim(-0.25, 1.75)
    ax.axis("off")
    handles = [Patch(color=RANK_COLOURS[r], label=f"rank {r}") for r in range(p)]
    fig.legend(handles=handles, loc="outside right center", fontsize=9)
    fig.suptitle(f"A transformer layer with sequence parallelism, p = {p} (forward pass)")
    return fig


def plt_rect(xy: tuple[float, float], w: float, h: float, colour: str, alpha: float) -> Rectangle:
    """A filled rectangle patch."""
    return Rectangle(xy, w, h, facecolor=colour, alpha=alpha, edgecolor="white")


def comm_frame(b: int = 1, s: int = 2048, h: int = 12288, p: int = 8) -> list[tuple[str, str]]:
    """What the communication explorer shows: the bytes per layer and the predicted times (`cost_model`)
    for batch b, sequence s, hidden size h and TP size p, as (label, value) rows."""
    mb = cost_model.layer_wire_bytes(b, s, h, p) / 1e6
    pp = cost_model.pipeline_stage_bytes(b, s, h) / 1e6
    t_nv = cost_model.layer_time(b, s, h, p, cost_model.NVLINK_A100) * 1e3
    t_ib = cost_model.layer_time(b, s, h, p, cost_model.INFINIBAND_HDR) * 1e3
    t_c = cost_model.layer_flops(b, s, h) / p / cost_model.A100_PEAK_FLOPS * 1e3
    return [("bytes sent per rank per layer (fwd + bwd, bf16)", f"{mb:,.1f} MB"),
            ("a pipeline stage boundary, per micro-batch", f"{pp:,.1f} MB"),
            ("compute per layer at A100 peak", f"{t_c:,.2f} ms"),
            ("TP all-reduces over NVLink (300 GB/s each way)", f"{t_nv:,.2f} ms"),
            ("TP all-reduces over InfiniBand HDR (25 GB/s each way)", f"{t_ib:,.2f} ms")]


def comm_explorer():
    """A widget: pick batch, sequence length, hidden size and TP size; see the bytes per layer and the
    predicted time on NVLink and InfiniBand beside the compute time (`comm_frame`, also the static book
    version over a small grid)."""
    import ipywidgets as widgets

    hidden = [1024, 2048, 4096, 8192, 12288, 16384]
    c = {"b": widgets.IntSlider(value=1, min=1, max=16, description="batch b"),
         "s": widgets.Dropdown(options=[512, 1024, 2048, 4096, 8192], value=2048, description="seq s"),
         "h": widgets.Dropdown(options=hidden, value=12288, description="hidden h"),
         "p": widgets.Dropdown(options=[2, 4, 8, 16, 32, 64], value=8, description="TP size p")}
    return live_explorer("tp-comm", comm_frame, c,
                         {"b": [1, 4, 16], "s": [512, 2048, 8192], "h": [4096, 12288], "p": [2, 8, 64]},
                         [widgets.HBox([c["b"], c["s"]]), widgets.HBox([c["h"], c["p"]])])
