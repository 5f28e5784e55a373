"""Chapter 7's PowerSGD beside the methods of section 3: the same task, data and inner AdamW, with the
gradients exchanged every step as a rank-r approximation (Vogels, Karimireddy & Jaggi 2019) through
`distlab.memory.compression.PowerSGD`, a DDP communication hook whose all-reduces `distlab.comm_log` counts
(labelled "powersgd")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.distributed as dist
from torch import nn

from distlab.comm_log import comm_log
from distlab.memory.compression import PowerSGD
from distlab.reference import Task

if TYPE_CHECKING:
    from distlab.fault_tolerance.replica_loop import Recipe, ReplicaRun


def powersgd_run(recipe: Recipe, model: nn.Module, task: Task, steps: int, global_batch: int, seed: int,
                 group: dist.ProcessGroup | None) -> ReplicaRun:
    """Inside a rank: train `model` with DDP + PowerSGD (rank `recipe.powersgd_rank`) and AdamW."""
    from distlab.fault_tolerance.replica_loop import ReplicaRun, inner_optimizer, train_shards
    state = PowerSGD(group=group, rank=recipe.powersgd_rank, seed=seed)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=1)
    ddp.register_comm_hook(state, PowerSGD.hook)
    inner = inner_optimizer(recipe, list(model.parameters()))
    with comm_log() as log:
        losses = train_shards(task, steps, global_batch, seed, group, ddp, inner, inner.step)
    params = {n: q.detach().clone() for n, q in model.named_parameters()}
    return ReplicaRun(losses, params, [], log.sent_bytes(where="powersgd"), log.calls(where="powersgd"))
