"""The peak of one pipelined training step on each stage, predicted tensor by tensor and measured.

Chapter 4's executor (`pipeline.executor.run_schedule`) runs a schedule's actions on each rank; a stage
keeps, per micro-batch that has run forward and not yet backward, the tensors autograd saved (its stash):
GPipe holds all m micro-batches before the first backward (Huang et al. 2019), 1F1B at most p - rank
(Narayanan et al. 2021, sec. 2.2.1). `predict_pipeline_peak` walks the same action list for a 2-stage
MLP, `Linear(d0, d1), GELU | Linear(d1, d2)` with `mse_loss` on the last stage, b rows per micro-batch,
fp32, and allocates and frees what each action does:

- stage 0, F: the Linear's output (saved by the GELU) and the GELU's output (the activation sent on);
  B: the received output gradient, the GELU's input gradient, and the weight and bias gradients (the
  first B's become `.grad`, the later ones are added into it and freed);
- stage 1, recv_fwd: the input (saved by the Linear); F: the Linear's output (saved by the loss), the
  loss (whose 0-dim result keeps a storage of b d2 elements on CPU) and the loss over m; B: the loss's
  gradients, the input gradient to send back, the weight and bias gradients.

On gloo a send is kept, with its tensor, until the step's `finish()` (`pipeline.p2p`), so every
activation stage 0 sends (m of them) and every input gradient stage 1 sends stays alive to the end of
the step, whatever the schedule: 1F1B bounds the stash autograd keeps, not what the executor keeps for
its sends. The prediction counts that, and `measure_pipeline_step` measures it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distlab.memory.estimate.timeline import Timeline
from distlab.memory.measure.peak_zero import ResizingLiveBytes

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class StagePeak:
    """One stage's peak bytes in a pipelined step."""

    schedule: str
    stage: int
    peak_bytes: int


def _check(schedule: str, dims: tuple[int, int, int], batch: int, m: int) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not modelled; choose one of {SCHEDULES}")
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"dims={dims}: give three positive widths (d0, d1, d2)")
    if m < 1 or batch % m:
        raise ValueError(f"batch={batch}, m={m}: m must be positive and divide the batch")


def _stage0(tl: Timeline, op: str, mb: int, d: tuple[int, int, int], b: int, first: bool) -> None:
    d0, d1, _ = d
    if op == "F":
        tl.alloc(f"a{mb}", 4 * b * d1, "activations")
        tl.alloc(f"out{mb}", 4 * b * d1, "activations")  # stashed, and kept by its send
    elif op == "recv_bwd":
        tl.alloc(f"dout{mb}", 4 * b * d1)
    elif op == "B":
        tl.alloc("d.a", 4 * b * d1)
        tl.free(f"dout{mb}")
        grads = ("g.W", "g.b") if first else ("t.W", "t.b")
        tl.alloc(grads[0], 4 * d0 * d1, "grads")
        tl.alloc(grads[1], 4 * d1, "grads")
        tl.free("d.a", f"a{mb}", "t.W", "t.b")


def _stage1(tl: Timeline, op: str, mb: int, d: tuple[int, int, int], b: int, first: bool) -> None:
    _, d1, d2 = d
    if op == "recv_fwd":
        tl.alloc(f"x{mb}", 4 * b * d1, "activations")
    elif op == "F":
        tl.alloc(f"o{mb}", 4 * b * d2, "activations")
        tl.alloc("mse", 4 * b * d2)
        tl.alloc(f"loss{mb}", 4, "activations")
        tl.free("mse")
    elif op == "B":
        tl.alloc("d.loss", 4)
        tl.alloc("d.mse", 4)
        tl.alloc("d.o", 4 * b * d2)
        tl.free("d.loss", f"o{mb}")
        tl.alloc(f"dx{mb}", 4 * b * d1)  # sent back, and kept by its send
        grads = ("g.W", "g.b") if first else ("t.W", "t.b")
        tl.alloc(grads[0], 4 * d1 * d2, "grads")
        tl.alloc(grads[1], 4 * d2, "grads")
        tl.free("d.o", "d.mse", f"x{mb}", f"loss{mb}", "t.W", "t.b")


def predict_pipeline_peak(schedule: str, stage: int, dims: tuple[int, int, int], batch: int,
                          m: int) -> StagePeak:
    """The peak bytes of stage `stage` (0 or 1) in one step of `schedule` on the 2-stage MLP of
    `dims`, a batch of `batch` rows in m micro-batches, parameters included, `.grad` empty at the start."""
    from distlab.pipeline.schedules import make_schedule

    _check(schedule, dims, batch, m)
    if stage not in (0, 1):
        raise ValueError(f"stage={stage!r}: the model has two stages, 0 and 1")
    d0, d1, d2 = dims
    tl = Timeline()
    tl.alloc("params", 4 * ((d0 * d1 + d1) if stage == 0 else (d1 * d2 + d2)), "params")
    seen_b = False
    for a in make_schedule(schedule, 2, m).actions[stage]:
        tl.phase = "backward" if a.op == "B" else "forward"
        (_stage0 if stage == 0 else _stage1)(tl, a.op, a.microbatch, dims, batch // m, not seen_b)
        seen_b = seen_b or a.op == "B"
    return StagePeak(schedule, stage, tl.peak)


def measure_pipeline_step(schedule: str, dims: tuple[int, int, int], batch: int, m: int,
                          group: dist.ProcessGroup | None = None) -> StagePeak:
    """On each rank of a 2-rank `group`: one warm-up step, then one measured step of `schedule` (the
    executor's, `run_schedule`) on the 2-stage MLP; this rank's stage and peak bytes."""
    from distlab.pipeline.executor import run_schedule
    from distlab.pipeline.schedules import make_schedule

    _check(schedule, dims, batch, m)
    d0, d1, d2 = dims
    torch.manual_seed(0)
    layers = [nn.Linear(d0, d1), nn.GELU(), nn.Linear(d1, d2)]
    rank = dist.get_rank(group)
    module = nn.Sequential(*layers[:2]) if rank == 0 else nn.Sequential(layers[2])
    g = torch.Generator().manual_seed(1)
    xs = list(torch.randn(batch, d0, generator=g).chunk(m))
    ys = list(torch.randn(batch, d2, generator=g).chunk(m))
    plan = make_schedule(schedule, 2, m)
    shapes = {0: xs[0].shape, 1: torch.Size([batch // m, d1])}

    def step() -> None:
        for q in module.parameters():
            q.grad = None
        run_schedule(plan, {rank: module}, xs, ys, F.mse_loss, shapes, group)

    step()
    for q in module.parameters():
        q.grad = None
    tracker = ResizingLiveBytes([])
    tracker.adopt(module.parameters())
    with tracker:
        run_schedule(plan, {rank: module}, xs, ys, F.mse_loss, shapes, group)
    return StagePeak(schedule, rank, tracker.peak)
