"""Time a tensor-parallel MLP step on this machine, ours beside PyTorch's built-in tensor parallelism.

`time_mlp_step` runs on every rank of a group. It builds the dense feed-forward block of
`distlab.models` (c_fc, GELU, c_proj), then three versions of it on the same weights:

- ours: `ParallelMLP` (column-parallel c_fc, row-parallel c_proj, `f` and `g`; Shoeybi et al. 2019);
- PyTorch's: `parallelize_module` with `ColwiseParallel` for c_fc and `RowwiseParallel` for c_proj
  (torch.distributed.tensor.parallel, built on DTensor), the same split;
- the collectives alone: the one forward and one backward all-reduce of b x s x h elements that the
  block needs, timed with `dist.all_reduce`.

It checks that both parallel versions give the dense output (float32, 1e-5), then reports the median
time of a forward and backward step of each, in seconds, and the ratio of ours to PyTorch's. It runs on
the whole world or on any `group` (one dim of a mesh).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist

from distlab.comm_log import comm_log
from distlab.mesh import group_rank, group_size
from distlab.models import GPTConfig, MLPBlock
from distlab.tensor_parallel.comm import Group
from distlab.tensor_parallel.layers import shard_cols, shard_rows
from distlab.tensor_parallel.model import ParallelMLP
from distlab.timing import median_seconds


def time_mlp_step(hidden: int = 256, batch: int = 8, seq: int = 64, iters: int = 10, *,
                  group: Group = None) -> dict[str, float]:
    """Median seconds per forward + backward step of our MLP, PyTorch's, and their two all-reduces, on
    this rank of `group` (None = the world); also the largest output difference of each from the dense
    block, the bytes recorded, and `ours_over_torch`, the ratio of the two steps' times."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rank, p = group_rank(group), group_size(group)
    config = GPTConfig(vocab_size=p, n_embd=hidden, n_head=p)
    torch.manual_seed(0)
    dense = MLPBlock(config)
    ours = ParallelMLP(config, group=group)
    with torch.no_grad():
        ours.c_fc.weight.copy_(shard_rows(dense.c_fc.weight, rank, p))
        ours.c_fc.bias.copy_(shard_rows(dense.c_fc.bias, rank, p))
        ours.c_proj.weight.copy_(shard_cols(dense.c_proj.weight, rank, p))
        ours.c_proj.bias.copy_(dense.c_proj.bias)
    mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, "cpu")
    theirs = parallelize_module(copy.deepcopy(dense), mesh,
                                {"c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()})
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1))
    ref = dense(x)
    out = {"ours_diff": (ours(x) - ref).abs().max().item(),
           "torch_diff": (theirs(x) - ref).abs().max().item()}

    def step(model: torch.nn.Module) -> Callable[[], None]:
        def run() -> None:
            xi = x.clone().requires_grad_(True)
            model(xi).sum().backward()
        return run

    buf = torch.randn(batch, seq, hidden)

    def collectives() -> None:
        for _ in range(2):  # g forward, f backward
            dist.all_reduce(buf, group=group)

    with comm_log() as log:  # one step, counted apart: a log makes every op pass through Python
        step(ours)()
    out["bytes_per_step"] = log.bytes()
    out["ours_s"] = median_seconds(step(ours), iters, group=group, barrier=True)
    out["torch_s"] = median_seconds(step(theirs), iters, group=group, barrier=True)
    out["collectives_s"] = median_seconds(collectives, iters, group=group, barrier=True)
    out["ours_over_torch"] = out["ours_s"] / out["torch_s"]
    return out
