"""One training step of chapter 9's 3D trainer as one rank of a published layout, with no memory spent.

`dry_run(layout, rank)` makes this process rank `rank` of a fake world of `layout.world_size` ranks
(`fake_world`), builds `distlab.mesh.grid(dp=, pp=, tp=)` on it, and runs `Trainer3D.train_step` (the
same code the labs run on gloo: chapter 4's executor, chapter 5's layers and loss, chapter 7's ZeRO) on
the meta device. What it returns is read from what the code did, not from a formula:

- the communication: the trainer's own `distlab.comm_log` of the step, summed per (mesh axis,
  collective): calls, the whole buffers B, the ring bytes this rank sends and the group size; and
  chapter 9's `Transfer`s (`parallel3d.traffic.step_traffic`), which the checks compare with the cost model;
- the memory (`held`): parameters, gradients, Adam's state and the peak of the saved activations,
  with attention saving what the fused kernel of a real run saves (`attention="flash"`, the default:
  `attention.FusedAttentionOnMeta`), or what the meta device's math path saves (`attention="math"`).

`step_on_ranks` is the same step with values, for small worlds on real ranks (`distlab.launch.run`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from distlab.comm_log import CommLog
from distlab.dryrun.attention import FusedAttentionOnMeta, check_attention
from distlab.dryrun.fake_world import fake_world
from distlab.dryrun.held import HeldBytes, gradient_watch, model_state_bytes
from distlab.dryrun.layouts import DryLayout
from distlab.memory.zero.engine import CONTROL
from distlab.mesh import grid
from distlab.parallel3d.cost_model import Traffic
from distlab.parallel3d.train import Trainer3D

__all__ = ["AxisCalls", "DryRun", "dry_run", "summarize"]


@dataclass
class AxisCalls:
    """The calls one rank made on one mesh axis with one collective in one step."""

    axis: str
    op: str
    group_size: int
    calls: int = 0
    nbytes: int = 0  # the sum of B, the whole buffers (comm_log's convention)
    sent_bytes: float = 0.0  # what this rank puts on the wire, ring algorithms (comm_log.ring_bytes)


@dataclass
class DryRun:
    """What one rank of `layout` did in one step: its coordinates, its calls, chapter 9's transfers and
    the bytes it held. `seconds` is the wall time of the dry run itself (not a prediction of anything)."""

    layout: DryLayout
    rank: int
    coords: dict[str, int]
    calls: list[AxisCalls]
    traffic: Traffic
    memory: HeldBytes
    control_calls: int = 0
    seconds: float = 0.0
    attention: str = "flash"


def summarize(log: CommLog) -> tuple[list[AxisCalls], int]:
    """The log's records per (axis, op), in order of first appearance; ZeRO's control all-reduce (a flag
    per parameter, not part of the model's traffic) counted apart."""
    out: dict[tuple[str, str], AxisCalls] = {}
    control = 0
    for r in log.records:
        if CONTROL in r.where.split("/"):
            control += 1
            continue
        row = out.setdefault((r.axis, r.op), AxisCalls(r.axis, r.op, r.group_size))
        row.calls += 1
        row.nbytes += r.nbytes
        row.sent_bytes += r.sent_bytes
    return list(out.values()), control


class _NoInitOnMeta(TorchFunctionMode):
    """Skip the in-place initializers (normal_, uniform_, zero_, fill_) on meta tensors, which have no values
    to fill: PyTorch runs them through its Python reference kernels, a few seconds for a large model."""

    SKIP = {"normal_", "uniform_", "zero_", "zeros_", "ones_", "fill_", "constant_", "trunc_normal_"}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        target = args[0] if args else (kwargs or {}).get("tensor")
        if getattr(func, "__name__", "") in self.SKIP and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **(kwargs or {}))


def _one_step(trainer: Trainer3D, idx: torch.Tensor, targets: torch.Tensor, attention: str) -> HeldBytes:
    """Run one step of `trainer`, measuring the bytes it holds; the gradients are counted as backward
    fills them, before ZeRO takes them. `attention="flash"` runs attention's fused kernel on meta."""
    with gradient_watch(trainer.model) as grads:
        if attention == "flash":
            with FusedAttentionOnMeta():
                trainer.train_step(idx, targets)
        else:
            trainer.train_step(idx, targets)
    params, optimizer = model_state_bytes(trainer.model, trainer.zero)
    return HeldBytes(params, grads.nbytes, optimizer, trainer.last_run.peak_stash_bytes)


def dry_run(layout: DryLayout, rank: int, dtype: torch.dtype = torch.float32,
            attention: str = "flash") -> DryRun:
    """One step of chapter 9's trainer as rank `rank` of `layout`, on the meta device in a fake world.

    `attention`: "flash" (attention saves what the fused kernel of a real run saves: q, k, v, its output
    and a log-sum-exp per row) or "math" (the s x s probabilities of the path the meta device takes by
    itself; an upper bound, no real run's memory)."""
    check_attention(attention)
    coords = layout.coords(rank)
    start = time.perf_counter()
    p = layout.plan
    with fake_world(rank, layout.world_size):
        mesh = grid(dp=p.dp, pp=p.pp, tp=p.tp)
        meta = torch.device("meta")
        with meta, _NoInitOnMeta():
            trainer = Trainer3D(mesh, layout.config, p, layout.batch, layout.seq, dtype=dtype, device=meta)
        idx = torch.zeros(layout.batch, layout.seq, dtype=torch.long, device=meta)
        memory = _one_step(trainer, idx, idx, attention)
        calls, control = summarize(trainer.log)
        traffic = trainer.traffic()
        trainer.close()
    if trainer.coords != coords:
        raise RuntimeError(f"the mesh put rank {rank} at {trainer.coords}, the layout at {coords}")
    return DryRun(layout, rank, coords, calls, traffic, memory, control, time.perf_counter() - start,
                  attention)
