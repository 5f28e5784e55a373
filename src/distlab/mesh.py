"""One grid of process groups for the whole course: a torch `DeviceMesh` with named axes.

Every parallelism in the course works inside one *group* of ranks and takes it as an argument
(`group=`). Where those groups come from is this file: the job's ranks are laid out as an
n-dimensional grid, one axis per kind of parallelism, and the ranks that differ only along axis `a` form
one group of `a`. (A mesh *axis* is one kind of parallelism; a *dim* is a tensor's dimension, as in
torchtitan.) With 8 ranks as (dp=2, pp=2, tp=2):

    pp=0: dp=0 -> ranks 0 1   (tp pairs: {0,1} {2,3} {4,5} {6,7})
          dp=1 -> ranks 2 3   (dp pairs: {0,2} {1,3} {4,6} {5,7})
    pp=1: dp=0 -> ranks 4 5   (pp pairs: {0,4} {1,5} {2,6} {3,7})
          dp=1 -> ranks 6 7

The axes are always laid out in the order of `AXIS_ORDER`, outermost first: tensor parallelism is the
innermost axis, so its ranks are consecutive and sit on one node (its all-reduces are on the critical
path and want NVLink), and pipeline parallelism is the outermost, so its point-to-point traffic is the
one that crosses nodes (Narayanan et al. 2021, sec. 3.2-3.3; torchtitan lays out its mesh the same way).

`grid` builds the mesh with `torch.distributed.device_mesh.init_device_mesh`, the object FSDP2, DTensor
and torch.distributed.pipelining build on. Its device type is the rank's (`launch.device()`): "cuda" under
NCCL, "cpu" under gloo, and "cuda" under gloo with DISTLAB_DEVICE=cuda (ranks sharing a GPU). Take
an axis's group with `mesh["tp"].get_group()` and pass it to a chapter's API. `flat_group` joins several
axes into one group (DeviceMesh flattening), and `dp_cp_group` is the one the loss is averaged and the
gradients are reduced over once the sequence is split too (context parallelism): dp x cp.

`layout` computes the same grid without any process group, for pictures, exercises and tests
(`distlab.layout.Layout` holds the sizes, and gives its coordinates, groups, mesh and label).
`group_rank` and `group_size` are what every chapter asks of the group it was given. `mesh_axes` names a
mesh's axes, and `require_axes` is the course's one "is this axis in the mesh" check and message.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from distlab import launch

# Outermost first. pp: pipeline stages; dp: data-parallel replicas (and ZeRO shards); ep: expert
# parallelism; cp: context parallelism (the sequence split over ranks); tp: tensor (and sequence) parallelism.
AXIS_ORDER = ("pp", "dp", "ep", "cp", "tp")
# HSDP (chapter 11) splits dp in two, in its place: replicas outside, ZeRO-3 shards inside
# (torchtitan's names).
DP_SPLIT = ("dp_replicate", "dp_shard")


def layout_sizes(axes: dict[str, int | None], world_size: int | None) -> dict[str, int]:
    """The axes that were given (a size, not None), in AXIS_ORDER, checked; no axis given means dp = the
    whole world (an error when the world is not known). `distlab.layout.Layout` keeps its sizes so."""
    split = [a for a in DP_SPLIT if axes.get(a) is not None]
    _check_dp_split(axes, split)
    order = [n for a in AXIS_ORDER for n in (DP_SPLIT if a == "dp" and split else (a,))]
    chosen = {name: axes[name] for name in order if axes.get(name) is not None}
    _check_positive(chosen)
    if not chosen:
        if world_size is None:
            raise ValueError("name at least one axis, e.g. layout(dp=2, tp=2)")
        chosen = {"dp": world_size}
    if world_size is not None:
        _check_product(chosen, world_size)
    return chosen


def _check_dp_split(axes: dict[str, int | None], split: list[str]) -> None:
    """HSDP's two dp axes come together and instead of dp."""
    if split and axes.get("dp") is not None:
        raise ValueError(f"dp={axes['dp']} and {split[0]}={axes[split[0]]} both given; dp_replicate x "
                         "dp_shard is the dp axis split in two (HSDP): give dp, or both of them")
    if split and len(split) == 1:
        raise ValueError(f"{split[0]}={axes[split[0]]} given alone; HSDP needs both dp_replicate= and "
                         "dp_shard= (use 1 for the one you do not split over)")


def _check_positive(chosen: dict[str, int]) -> None:
    """Every axis size given is a positive integer."""
    for name, size in chosen.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name}={size!r} must be a positive integer (the number of ranks along the "
                             f"{name} axis); use {name}=1 to keep the axis without splitting over it")


def _check_product(chosen: dict[str, int], world_size: int) -> None:
    """The axis sizes multiply to the job's world size."""
    if math.prod(chosen.values()) != world_size:
        given = ", ".join(f"{n}={s}" for n, s in chosen.items())
        product = " x ".join(str(s) for s in chosen.values())
        raise ValueError(f"grid({given}) needs {product} = {math.prod(chosen.values())} ranks, but the job "
                         f"has world_size={world_size}; choose axis sizes whose product is {world_size}")


def group_size(group: dist.ProcessGroup | None = None) -> int:
    """The number of ranks in `group` (None: the whole world); 1 in a single process without
    torch.distributed, so that a chapter's layers also run unsplit in a plain script."""
    if group is None and not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None = None, what: str = "process group") -> int:
    """This process's position in `group` (0 .. size - 1); 0 in a single process without
    torch.distributed. A rank that is not a member gets a ValueError: whatever it then did would not take
    part in the group's collectives. `what` names the group in that message (e.g. "tensor-parallel group")."""
    if group is None and not dist.is_initialized():
        return 0
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"this rank (global rank {dist.get_rank()}) is not a member of the {what} it was "
                         f"given (global ranks {dist.get_process_group_ranks(group)}); pass each rank the "
                         "group it belongs to, e.g. mesh['tp'].get_group() for grid(..., tp=...)")
    return rank


def layout(*, dp: int | None = None, pp: int | None = None, tp: int | None = None,
           cp: int | None = None, ep: int | None = None, dp_replicate: int | None = None,
           dp_shard: int | None = None) -> dict[str, list[list[int]]]:
    """The groups of every axis, as lists of global ranks, computed without torch.distributed.

    `layout(dp=2, tp=2)` is {"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]}: rank r's coordinates are
    the row-major digits of r over the axes in AXIS_ORDER, exactly as `grid` (DeviceMesh) numbers them.
    """
    sizes = layout_sizes({"dp": dp, "pp": pp, "tp": tp, "cp": cp, "ep": ep, "dp_replicate": dp_replicate,
                    "dp_shard": dp_shard}, None)
    ranks = torch.arange(math.prod(sizes.values())).reshape(*sizes.values())
    groups = {}
    for dim, name in enumerate(sizes):  # the axis `name` is dimension `dim` of the tensor of ranks
        lines = ranks.movedim(dim, -1).reshape(-1, sizes[name])
        groups[name] = sorted(line.tolist() for line in lines)
    return groups


def coordinates(rank: int, **sizes: int) -> dict[str, int]:
    """Rank `rank`'s position along each axis of a grid of `sizes` (e.g. coordinates(5, dp=2, tp=4))."""
    chosen = layout_sizes(dict(sizes), None)
    unknown = sorted(set(sizes) - set(AXIS_ORDER) - set(DP_SPLIT))
    if unknown:
        raise ValueError(f"unknown axis (axes) {unknown}; the axes are {list(AXIS_ORDER)}")
    total = math.prod(chosen.values())
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < total:
        raise ValueError(f"rank={rank!r} is outside the grid of {total} ranks (0 .. {total - 1})")
    coords = {}
    for name in reversed(list(chosen)):
        rank, coords[name] = divmod(rank, chosen[name])
    return {name: coords[name] for name in chosen}


def grid(*, dp: int | None = None, pp: int | None = None, tp: int | None = None, cp: int | None = None,
         ep: int | None = None, dp_replicate: int | None = None, dp_shard: int | None = None,
         device_type: str | None = None) -> DeviceMesh:
    """The job's ranks as a DeviceMesh with named axes, e.g. `grid(dp=2, tp=2)` on 4 ranks.

    Only the axes you name are in the mesh (size 1 is allowed, and keeps the axis so that code can always
    ask for `mesh["tp"]`); with none named, the mesh is one axis "dp" over the whole world. HSDP (chapter
    11) names `dp_replicate=` and `dp_shard=` instead of `dp=`: two axes in dp's place, replicas outside
    and ZeRO-3 shards inside (torchtitan's names; `flat_group(mesh, *DP_SPLIT)` is the whole dp). The product
    of the sizes must equal the world size. `device_type` defaults to the type of the rank's device,
    `launch.device()`: "cuda" under NCCL, and under gloo "cpu", or "cuda" when DISTLAB_DEVICE=cuda puts
    the ranks' tensors on shared GPUs (a mesh must be on the device its tensors are on). Call it on every
    rank, in the same order as every other collective: creating the groups is itself a collective operation.
    """
    if not dist.is_initialized():
        raise RuntimeError("grid() needs a process group, and none is initialised in this process: call "
                           "it inside a function started by distlab.launch.run(fn, world_size) or under "
                           "torchrun")
    sizes = layout_sizes({"dp": dp, "pp": pp, "tp": tp, "cp": cp, "ep": ep, "dp_replicate": dp_replicate,
                    "dp_shard": dp_shard}, dist.get_world_size())
    if device_type is None:
        device_type = launch.device().type
    return init_device_mesh(device_type, tuple(sizes.values()), mesh_dim_names=tuple(sizes))


def mesh_axes(mesh: DeviceMesh) -> tuple[str, ...]:
    """The names of `mesh`'s axes, outermost first; () for a mesh built without names."""
    return tuple(mesh.mesh_dim_names or ())


def require_axes(mesh: DeviceMesh, *axes: str, where: str, fix: str | None = None) -> tuple[str, ...]:
    """The mesh's axes (as `mesh_axes`), or a ValueError if one of `axes` is not among them: the one
    "is this axis in the mesh" check of the course. The message starts with `where` (the call and the
    parameter that named the axis, e.g. "dp_group(axis='ep')"), names the missing axes and the mesh's
    axes, and ends with `fix` (default: build the mesh with `grid` naming the missing axes)."""
    names = mesh_axes(mesh)
    missing = [a for a in axes if a not in names]
    if missing:
        if fix is None:
            fix = "build the mesh with distlab.mesh.grid(" + "".join(f"{a}=..., " for a in missing) + "...)"
        which = "axis" if len(missing) == 1 else "axes"
        raise ValueError(f"{where}: the mesh has no {which} {', '.join(map(repr, missing))}; its axes are "
                         f"{list(names)}; {fix}")
    return names


def flat_group(mesh: DeviceMesh, *axes: str) -> dist.ProcessGroup:
    """This rank's group over several axes of `mesh` at once (all of them when none is named): the ranks
    that differ only along `axes`, flattened into one group named "_".join(axes) in mesh order
    (DeviceMesh flattening, as torchtitan builds its "dp_cp" mesh). One axis is that axis's own group.
    Call it on every rank: the first call creates the group, a collective operation."""
    names = require_axes(mesh, *axes, where=f"flat_group(axes={list(axes)})", fix="name axes the mesh has")
    chosen = tuple(a for a in names if a in axes) if axes else names
    if len(chosen) == 1:
        return mesh[chosen[0]].get_group()
    return mesh[chosen]._flatten("_".join(chosen)).get_group()


def dp_cp_group(mesh: DeviceMesh) -> dist.ProcessGroup:
    """The group over which the loss is averaged and the gradients are reduced when a batch is split
    both by sequences (dp) and along each sequence (cp): dp x cp flattened, the ranks that hold the same
    weights but different tokens (Dubey et al. 2024, sec. 3.3.2 reduce gradients over cp and dp
    together). A mesh without a cp axis gives its dp group, one without dp its cp group."""
    present = [a for a in ("dp", "cp") if a in mesh_axes(mesh)]
    if not present:
        raise ValueError(f"the mesh has axes {list(mesh_axes(mesh))} and neither dp nor cp; build "
                         "it with distlab.mesh.grid(dp=..., cp=...)")
    return flat_group(mesh, *present)


def describe(mesh: DeviceMesh) -> str:
    """One line per axis: its size and its groups as global ranks (what a lab prints to show the mesh)."""
    sizes = {name: mesh.size(i) for i, name in enumerate(mesh_axes(mesh))}
    lines = []
    for name, groups in layout(**sizes).items():
        lines.append(f"{name} (size {sizes[name]}): " + " ".join("{" + ",".join(map(str, g)) + "}"
                                                                  for g in groups))
    return "\n".join(lines)
