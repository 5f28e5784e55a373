"""The figures of chapter 2 and its lab, drawn from the package's own data structures.

- `timeline_figure`: one or more `StepTimeline`s (measured by `bench`, or predicted by
  `cost_model.predicted_timeline`): backward, and each bucket's all-reduce in flight.
- `bucket_figure`: which parameter goes into which bucket (`sync.make_buckets`), in backward order.
- `scaling_figure`: samples per second against the number of ranks, measured and predicted.
- `book_*`: the book's versions, with illustrative machine parameters stated in their titles.
- `timeline_explorer`: the lab's widget over the predicted timeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from torch import nn

from distlab.collectives.cost_model import MachineParams
from distlab.data_parallel.buckets import make_buckets
from distlab.data_parallel.cost_model import predict_step_seconds, predicted_timeline
from distlab.data_parallel.timeline import StepTimeline
from distlab.explorers import live_explorer
from distlab.style import COMMUNICATION, COMPUTE, GREY, LINES, VERMILION, done

if TYPE_CHECKING:
    import ipywidgets

COMM = (COMMUNICATION, VERMILION)  # neighbouring buckets alternate between the two


def timeline_figure(timelines: Sequence[StepTimeline], title: str = "One training step") -> Figure:
    """A Gantt chart: per timeline, a row for backward (compute) and a row for the all-reduces, with
    alternating colours per bucket; the label gives the hidden share of communication."""
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.85 * len(timelines)))
    ticks, labels = [], []
    for row, t in enumerate(timelines):
        y = 2.2 * (len(timelines) - 1 - row)
        ax.broken_barh([(0, t.backward_end * 1e3)], (y + 1.05, 0.8), color=COMPUTE)
        bars = [(a * 1e3, (b - a) * 1e3) for a, b in zip(t.launch, t.done, strict=True)]
        for i, bar in enumerate(bars):
            ax.broken_barh([bar], (y + 0.1, 0.8), color=COMM[i % 2], edgecolor="white", linewidth=0.5)
        ax.axvline(t.step_start * 1e3, ymin=0, ymax=1, color=GREY, lw=0.4, ls=":")
        ax.plot([t.step_start * 1e3], [y + 0.5], marker="|", color="black", markersize=14)
        ticks += [y + 1.45, y + 0.5]
        labels += [f"{t.strategy}: backward",
                   f"all-reduce ({len(bars)} msgs, {t.hidden_fraction:.0%} hidden)"]
    ax.set_yticks(ticks, labels)
    ax.set_xlabel("time from the start of backward (ms); | marks when the optimizer step can start")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return done(fig)


def bucket_figure(model: nn.Module, bucket_bytes: int, title: str | None = None) -> Figure:
    """Each parameter as a bar of its gradient bytes, in backward order (top = first ready), coloured
    by the bucket `make_buckets` puts it in."""
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    buckets = make_buckets(params, bucket_bytes)
    fig, ax = plt.subplots(figsize=(7.5, 0.6 + 0.22 * len(params)))
    y, ticks, labels = 0, [], []
    def colour(b: int) -> str:
        return LINES[b % (len(LINES) - 1)]  # the palette's line colours, without black

    widest = max(p.numel() * p.element_size() for p in params) / 1024
    for b, bucket in enumerate(buckets):
        for p in bucket:
            ax.barh(y, p.numel() * p.element_size() / 1024, color=colour(b))
            ticks.append(y)
            labels.append(names[id(p)])
            y -= 1
        ax.axhline(y + 0.5, color="black", lw=0.6)
        ax.text(widest * 1.3, y + 0.6, f"bucket {b}", ha="right", va="bottom", fontsize=7, color=colour(b))
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_xlim(0, widest * 1.3)
    ax.set_xlabel("gradient size (KiB)")
    ax.set_ylabel("parameters in backward order (first ready on top)")
    ax.set_title(title or f"{len(buckets)} buckets of at most {bucket_bytes / 1024:g} KiB "
                          f"({sum(p.numel() for p in params) * 4 / 1024:.0f} KiB of gradients)")
    fig.tight_layout()
    return done(fig)


def scaling_figure(world_sizes: Sequence[int], measured: Mapping[str, Sequence[float]],
                   predicted: Mapping[str, Sequence[float]], ideal_per_rank: float | None = None,
                   title: str = "Data-parallel throughput against ranks") -> Figure:
    """Samples per second against the number of ranks: measured series as markers, predicted series
    as lines, and perfect linear scaling from `ideal_per_rank` samples/s per rank (dashed)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ps = list(world_sizes)
    for i, (name, ys) in enumerate(measured.items()):
        ax.plot(ps, ys, "o-", color=LINES[i % len(LINES)], label=f"{name} (measured)")
    for i, (name, ys) in enumerate(predicted.items()):
        ax.plot(ps, ys, "-" if i % 2 == 0 else "-.", color=LINES[(i + len(measured)) % len(LINES)], alpha=0.8,
                label=f"{name} (predicted)")
    if ideal_per_rank:
        ax.plot(ps, [ideal_per_rank * p for p in ps], "k--", lw=0.8, label="linear scaling")
    ax.set_xticks(ps)
    ax.set_xlabel("ranks p")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return done(fig)


# --------------------------------------------------------------------------------------------------
# The book's figures: predicted, with illustrative parameters (a GPU-like link, not a measurement)
# --------------------------------------------------------------------------------------------------

BOOK_MACHINE = MachineParams(alpha=20e-6, beta=1 / 10e9)  # 20 µs per message, 10 GB/s each way


def _book_param_bytes() -> list[int]:
    """Gradient bytes, in backward order, of a GPT with 8 layers of width 256: 6.4 M parameters in 102
    tensors (float32)."""
    from distlab.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=64, block_size=64, n_layer=8, n_head=8, n_embd=256))
    return [p.numel() * 4 for p in reversed(list(model.parameters()))]


def book_timeline_figure(p: int = 8, backward_seconds: float = 4e-3, bucket_bytes: int = 4 << 20) -> Figure:
    """Predicted timelines of the three strategies for a 6.4 M-parameter GPT (8 layers, width 256)."""
    sizes = _book_param_bytes()
    lines = [predicted_timeline(sizes, backward_seconds, 1, p, BOOK_MACHINE, False, "per_parameter"),
             predicted_timeline(sizes, backward_seconds, bucket_bytes, p, BOOK_MACHINE, False, "bucketed"),
             predicted_timeline(sizes, backward_seconds, bucket_bytes, p, BOOK_MACHINE, True, "overlapped")]
    return timeline_figure(lines, f"Predicted step, p = {p}, backward {backward_seconds * 1e3:g} ms, buckets "
                                  f"{bucket_bytes >> 20} MiB, α = 20 µs, 1/β = 10 GB/s (illustrative)")


def book_bucket_figure() -> Figure:
    """The buckets of the lab's small GPT (2 layers, n_embd 32) with 16 KiB buckets."""
    import torch

    from distlab.reference import gpt_task

    torch.manual_seed(0)
    return bucket_figure(gpt_task().make_model(), 16 << 10)


def book_scaling_figure(compute_seconds: float = 4e-3, max_p: int = 16) -> Figure:
    """Predicted throughput of the 6.4 M-parameter GPT against p: no overlap, perfect overlap, linear."""
    ps = list(range(1, max_p + 1))
    nbytes, batch = sum(_book_param_bytes()), 64
    pred = {name: [p * batch / predict_step_seconds(p, compute_seconds, nbytes, BOOK_MACHINE, overlap=ov)
                   for p in ps] for name, ov in (("no overlap", False), ("perfect overlap", True))}
    return scaling_figure(ps, {}, pred, ideal_per_rank=batch / compute_seconds,
                          title=f"Predicted: 64 samples/rank, compute {compute_seconds * 1e3:g} ms, "
                                "α = 20 µs, 1/β = 10 GB/s (illustrative)")


BUCKET_KIB = [64, 256, 1024, 4096, 16384, 25600]


def timeline_frame(p: int = 8, bucket: int = 4 << 20, backward_ms: float = 4.0, alpha_us: float = 20.0,
                   bandwidth_GBps: float = 10.0) -> Figure:
    """What the timeline explorer shows: the predicted step of the book's GPT on p ranks, per parameter,
    bucketed (`bucket` bytes) and overlapped, with backward time, alpha and bandwidth as given."""
    m = MachineParams(alpha=alpha_us * 1e-6, beta=1 / (bandwidth_GBps * 1e9))
    t, sizes = backward_ms * 1e-3, _book_param_bytes()
    lines = [predicted_timeline(sizes, t, 1, p, m, False, "per_parameter"),
             predicted_timeline(sizes, t, bucket, p, m, False, "bucketed"),
             predicted_timeline(sizes, t, bucket, p, m, True, "overlapped")]
    return timeline_figure(lines, f"Predicted step of a 6.4 M-parameter GPT on {p} ranks")


def timeline_explorer() -> ipywidgets.VBox:
    """A widget: the predicted timelines of the book's GPT (6.4 M parameters in 100 tensors) as you move
    the number of ranks, the bucket size, the backward time, alpha and the bandwidth (`timeline_frame`,
    also the static book version over a small grid)."""
    import ipywidgets as widgets

    style = {"description_width": "110px"}
    buckets = [(f"{k // 1024} MiB" if k >= 1024 else f"{k} KiB", k << 10) for k in BUCKET_KIB]
    c = {"p": widgets.IntSlider(8, 2, 64, description="ranks p", style=style),
         "bucket": widgets.SelectionSlider(options=buckets, value=4 << 20, description="bucket", style=style),
         "backward_ms": widgets.FloatSlider(4.0, min=0.5, max=20.0, step=0.5, description="backward (ms)",
                                            style=style),
         "alpha_us": widgets.FloatLogSlider(20.0, base=10, min=0, max=3, description="α (µs)", style=style),
         "bandwidth_GBps": widgets.FloatLogSlider(10.0, base=10, min=-1, max=2.7, description="1/β (GB/s)",
                                                  style=style)}
    columns = widgets.HBox([widgets.VBox([c["p"], c["bucket"], c["backward_ms"]]),
                            widgets.VBox([c["alpha_us"], c["bandwidth_GBps"]])])
    grid = {"p": [2, 8, 32], "bucket": [256 << 10, 4 << 20, 25 << 20]}
    return live_explorer("dp-timeline", timeline_frame, c, grid, [columns])
