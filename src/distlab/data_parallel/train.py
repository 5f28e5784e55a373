"""The data-parallel training loop, from scratch, and the single-process loop it must agree with.

Data parallelism (Li et al. 2020, "PyTorch Distributed", VLDB 13(12), sec. 3) in five steps, each a
line of `train_data_parallel`. It runs on the p ranks of a process group `group` (None: the whole world;
or one dim of a mesh, `mesh["dp"].get_group()`), and "rank r" below is a position 0..p-1 in that group:

1. every rank builds the same model and `broadcast_parameters` copies the group's rank 0's weights to all,
   then `check_replicas_identical` proves it (a hash of every parameter, all-gathered in the group);
2. at step t every rank draws the same global batch of B indices (`sharding.batch_indices`) and keeps its
   own B/p of them (`sharding.shard`, by its position in the group);
3. forward and backward on that shard give the gradient of the shard's mean loss (`Task.shard_loss`, the
   course's one step on a rank);
4. a gradient-sync strategy from `sync` averages the gradients over the ranks: now every rank holds the
   gradient of the mean loss over the whole batch of B;
5. every rank takes the same optimizer step from the same weights and so ends with the same weights.

With `accumulation_steps` k, step 3 runs k times on micro-batches of B/(p k) (micro-batch j of rank r is
shard r k + j of p k), with each loss divided by k and the first k-1 backward passes inside `no_sync`:
only the last one communicates.

The `Task` (a model, its data and its loss), the `SGD` optimizer and the single-process loop come from the
ground floor, `distlab.reference`: `train_single_process` is that loop on a task's global batches.
"""

from __future__ import annotations

import hashlib
import math
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab import launch
from distlab.data_parallel.buckets import DEFAULT_BUCKET_BYTES, check_bucket_bytes
from distlab.data_parallel.sync import STRATEGIES, check_strategy, group_size_and_rank, make_strategy
from distlab.reference import SGD, Task, train_reference

# --------------------------------------------------------------------------------------------------
# Replicas must start equal
# --------------------------------------------------------------------------------------------------

def broadcast_parameters(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Copy the parameters and buffers of the group's rank 0 to every rank of `group` (one broadcast
    each), as DDP does when it is constructed (Li et al. 2020, sec. 3)."""
    group_size_and_rank(group)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, group=group, group_src=0)


def parameter_hashes(model: nn.Module) -> Tensor:
    """One 56-bit hash of the bytes of each parameter, as an int64 tensor (equal weights, equal hashes)."""
    out = []
    for p in model.parameters():
        raw = p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        out.append(int.from_bytes(hashlib.blake2b(raw, digest_size=7).digest(), "little"))
    return torch.tensor(out, dtype=torch.int64)


def check_replicas_identical(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Raise ValueError on every rank of `group` if any parameter differs between them, naming the first.

    All ranks all-gather the hashes of their parameters and compare them, so all ranks agree on the
    verdict and raise together: no rank is left waiting in a later collective. Ranks in the message are
    positions in the group.
    """
    size, _ = group_size_and_rank(group)
    mine = parameter_hashes(model).to(launch.device())
    everyone = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(everyone, mine, group=group)
    names = [name for name, _ in model.named_parameters()]
    for i, name in enumerate(names):
        differ = [r for r, h in enumerate(everyone) if h[i] != everyone[0][i]]
        if differ:
            raise ValueError(
                f"parameter {name!r} differs between ranks at the start of training (ranks {differ} do not "
                "match rank 0), so the replicas would drift apart; seed the model identically on every "
                "rank (torch.manual_seed before building it) or call broadcast_parameters(model, group)")


# --------------------------------------------------------------------------------------------------
# The loops
# --------------------------------------------------------------------------------------------------

def check_batch(global_batch: int, world_size: int, accumulation_steps: int = 1) -> int:
    """The per-rank micro-batch size B / (p k), or a ValueError naming the value that does not divide."""
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch={global_batch!r} must be a positive integer, e.g. 12")
    k = accumulation_steps
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"accumulation_steps={accumulation_steps!r} must be a positive integer; use 1 "
                         "for no accumulation")
    if global_batch % world_size:
        raise ValueError(f"global_batch={global_batch} is not divisible by world_size={world_size}: the "
                         "ranks would get shards of different sizes and the average of their gradients "
                         "would not be the gradient of the batch; choose a global batch that is a "
                         f"multiple of {world_size}")
    local = global_batch // world_size
    if local % accumulation_steps:
        raise ValueError(f"the per-rank batch {local} (global_batch={global_batch} / world_size="
                         f"{world_size}) is not divisible by accumulation_steps={accumulation_steps}; "
                         f"choose a global batch that is a multiple of {world_size * accumulation_steps}")
    return local // accumulation_steps


def check_training(task: Task, steps: int, global_batch: int, lr: float) -> None:
    """Refuse settings under which a run would "agree" with its reference without testing anything, or
    would not be the run asked for: no steps, a learning rate that is zero, negative or not a number, a
    global batch larger than the data."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive integer: with no step the parameters are the "
                         "initial ones and any comparison passes without testing anything; e.g. steps=4")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr={lr!r} must be a finite positive number (a NaN or infinite rate makes every "
                         "parameter NaN, zero leaves them unchanged); e.g. lr=0.05")
    if isinstance(global_batch, int) and global_batch > len(task):
        raise ValueError(f"global_batch={global_batch} is larger than the {len(task)} examples of the "
                         f"task {task.name}; choose at most {len(task)}")


def make_optimizer(model: nn.Module, lr: float) -> SGD:
    """SGD with momentum 0.9 over the model's parameters."""
    return SGD(model.parameters(), lr=lr, momentum=0.9)


def train_data_parallel(task: Task, strategy: str = "overlapped", steps: int = 4, global_batch: int = 12,
                        lr: float = 0.05, seed: int = 0, accumulation_steps: int = 1,
                        bucket_bytes: int = DEFAULT_BUCKET_BYTES, broadcast: bool = True,
                        model: nn.Module | None = None,
                        group: dist.ProcessGroup | None = None) -> dict[str, Tensor]:
    """Inside a rank: train `task` for `steps` steps with data parallelism over the ranks of `group`
    (None: the whole world); return the final parameters.

    strategy: "per_parameter", "bucketed", "overlapped" (see `sync`) or "ddp" (PyTorch's
        DistributedDataParallel, the built-in to compare with, on the same group).
    broadcast: copy the group's rank 0's initial weights to every rank first (False skips it, to show
        the check).
    model: use this model instead of `task.build(seed)` (for example one built differently per rank).
    """
    check_strategy(strategy, (*STRATEGIES, "ddp"))
    check_training(task, steps, global_batch, lr)
    p, r = group_size_and_rank(group)
    check_batch(global_batch, p, accumulation_steps)
    check_bucket_bytes(bucket_bytes)
    dev = launch.device()
    model = (model if model is not None else task.build(seed)).to(dev)
    if broadcast:
        broadcast_parameters(model, group)
    check_replicas_identical(model, group)
    if strategy == "ddp":
        net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_bytes / 2**20,
                                                  process_group=group)
        sync, no_sync = None, net.no_sync
    else:
        net, sync = model, make_strategy(strategy, model, bucket_bytes, group=group)
        no_sync = sync.no_sync
    optimizer = make_optimizer(model, lr)
    k_steps = accumulation_steps
    for step in range(steps):
        x, y = (t.to(dev) for t in task.batch(step, global_batch, seed))
        optimizer.zero_grad(set_to_none=True)
        for k in range(k_steps):  # micro-batch k of rank r: shard r k_steps + k of p k_steps
            with nullcontext() if k == k_steps - 1 else no_sync():
                (task.shard_loss(net, x, y, r * k_steps + k, p * k_steps) / k_steps).backward()
        if sync is not None:
            sync.finish()
        optimizer.step()
    if sync is not None:
        sync.close()
    return {name: t.detach().cpu().clone() for name, t in model.named_parameters()}


def train_single_process(task: Task, steps: int = 4, global_batch: int = 12, lr: float = 0.05,
                         seed: int = 0) -> dict[str, Tensor]:
    """The reference: the same steps on one process, with the whole global batch at once
    (`distlab.reference.train_reference`); the final parameters."""
    check_training(task, steps, global_batch, lr)
    model = task.build(seed)
    return train_reference(model, task.batches(steps, global_batch, seed), task.loss,
                           make_optimizer(model, lr)).params
