"""HSDP, hybrid sharded data parallelism: ZeRO-3 inside each replica group, an all-reduce across them.

The dp ranks are laid out as a grid `grid(dp_replicate=R, dp_shard=S)` (R x S = dp; torchtitan's axis
names). Each row of S ranks is one *replica group*: it holds one copy of the model, sharded over its S
ranks by chapter 7's `fully_shard` (ZeRO-3: gather a block's parameters before its forward and backward,
reduce-scatter its gradient after). The R replica groups hold the same copy, so after the backward the
ranks at the same shard position average their gradient slices across the groups with one all-reduce
on the `dp_replicate` axis (Zhao et al. 2023, sec. 3.2.2 "hybrid sharding"; Rajbhandari et al. 2020's
P_os+g+p inside a group). With R = 1 it is ZeRO-3 over all ranks; with S = 1 it is plain data
parallelism.

Why: the all-gathers and reduce-scatters, three passes over the whole model per step, stay inside a
group of S ranks (one server's NVLink when S is its GPU count); only the all-reduce of a 1/S slice
crosses the slower network. The price is memory: a rank holds 1/S of the model states, not 1/(R S).
`cost_model.py` counts both; the tests count the bytes with `distlab.comm_log`.

    mesh = grid(dp_replicate=2, dp_shard=2)
    model = hsdp(task.build(seed), mesh)           # fully_shard over dp_shard, per block then the root
    loss = task.loss(model, x, y); loss.backward()
    replica_all_reduce_(model, mesh["dp_replicate"].get_group())
    optimizer.step()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from distlab.comm_log import where
from distlab.memory.zero import fsdp
from distlab.mesh import require_axes

REPLICATE, SHARD = "dp_replicate", "dp_shard"


def check_hsdp_mesh(mesh: DeviceMesh) -> None:
    """A ValueError unless `mesh` has the two axes of HSDP."""
    require_axes(mesh, REPLICATE, SHARD, where="hsdp(model, mesh)",
                 fix="build it with distlab.mesh.grid(dp_replicate=R, dp_shard=S)")


def default_blocks(model: nn.Module) -> list[nn.Module]:
    """The units to shard one by one: the children of the model's first `nn.ModuleList` (a GPT's
    blocks), else none (the model is one unit). The root is sharded last, as FSDP2 and chapter 7 do."""
    for m in model.modules():
        if isinstance(m, nn.ModuleList):
            return list(m)
    return []


def hsdp(model: nn.Module, mesh: DeviceMesh,
         blocks: Callable[[nn.Module], Iterable[nn.Module]] = default_blocks) -> nn.Module:
    """Shard `model` over the mesh's `dp_shard` axis (chapter 7's `fully_shard`, each block then the
    root) and return it; call `replica_all_reduce_` on the `dp_replicate` group after every backward.
    Every replica group must build the model from the same seed: each group's shard 0 broadcasts it only
    inside its group."""
    check_hsdp_mesh(mesh)
    group = mesh[SHARD].get_group()
    for block in blocks(model):
        fsdp.fully_shard(block, group=group)
    return fsdp.fully_shard(model, group=group)


@torch.no_grad()
def replica_all_reduce_(model: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Average this rank's gradient slices over `group` (the ranks at the same shard position in every
    replica group): one all-reduce of one flat buffer, labelled "hsdp replicas" in `comm_log`. A slice
    with no gradient on any replica keeps `.grad = None` (the optimizer skips it, as on one process);
    one without a gradient here but with one elsewhere adds zeros."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters; nothing to average across replicas")
    r = dist.get_world_size(group)
    sizes = [p.numel() for p in params]
    flat = torch.zeros(sum(sizes) + len(params), dtype=params[0].dtype, device=params[0].device)
    start = 0
    for k, p in enumerate(params):
        if p.grad is not None:
            flat[start:start + sizes[k]].copy_(p.grad.reshape(-1))
            flat[sum(sizes) + k] = 1.0  # "had a gradient" flags travel in the same call
        start += sizes[k]
    if r > 1:
        with where("hsdp replicas"):
            dist.all_reduce(flat, group=group)
    start = 0
    for k, p in enumerate(params):
        if flat[sum(sizes) + k] > 0:
            p.grad = flat[start:start + sizes[k]].view_as(p).div(r).to(p.dtype)
        start += sizes[k]
