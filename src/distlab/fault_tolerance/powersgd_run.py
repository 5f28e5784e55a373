"""Chapter 7's PowerSGD beside the methods of section 3: the same task, data and inner AdamW, with the
gradients exchanged every step as a rank-r approximation (Vogels, Karimireddy & Jaggi 2019) through
`distlab.data_parallel.powersgd.PowerSGD`, a DDP communication hook whose all-reduces `distlab.comm_log`
counts (labelled "powersgd"). `replica_loop.on_ranks` trains the wrapped model with its data loop."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from distlab.data_parallel.powersgd import PowerSGD


def powersgd_ddp(model: nn.Module, rank: int, seed: int, group: dist.ProcessGroup | None) -> nn.Module:
    """`model` in DDP over `group`, its gradients all-reduced as rank-`rank` PowerSGD factors (seeded)."""
    state = PowerSGD(group=group, rank=rank, seed=seed)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=1)
    ddp.register_comm_hook(state, PowerSGD.hook)
    return ddp
