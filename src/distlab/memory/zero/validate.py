"""What every ZeRO entry point checks before its first collective: the stage, the group, the mesh dim,
dense parameters; and a sparse gradient made dense."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh

from distlab.mesh import require_axes

STAGES = (0, 1, 2, 3)


def check_stage(stage: object) -> int:
    """`stage` if it is 0, 1, 2 or 3, else a ValueError that says what each one is."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not a ZeRO stage; choose 0 (plain data parallelism), 1 (shard "
                         "the optimizer state), 2 (+ gradients) or 3 (+ parameters)")
    return int(stage)  # type: ignore[call-overload]


def check_group(group: dist.ProcessGroup | None) -> None:
    """Raise a clear error, before any collective, when this rank cannot run ZeRO on `group`."""
    if not dist.is_initialized():
        raise RuntimeError("ZeRO needs a process group, and none is initialised in this process: build "
                           "it inside a function started by distlab.launch.run(fn, n) or under torchrun")
    if group is not None and dist.get_rank(group) < 0:
        raise ValueError(f"group={dist.get_process_group_ranks(group)} (global ranks) does not contain this "
                         f"rank ({dist.get_rank()}); pass the data-parallel group this rank belongs to, "
                         "e.g. mesh['dp'].get_group() on every rank")


def dp_group(mesh: DeviceMesh, axis: str = "dp") -> dist.ProcessGroup:
    """The group of this rank along the mesh's data-parallel axis `axis`, the group ZeRO shards over."""
    require_axes(mesh, axis, where=f"dp_group(axis={axis!r})",
                 fix=f"build the mesh with distlab.mesh.grid({axis}=..., ...) so that it has a data-parallel "
                 "axis")
    return mesh[axis].get_group()


def densify_grad(p: Tensor) -> None:
    """Make `p.grad` dense (strided) in place if it is sparse, as `nn.Embedding(sparse=True)` and
    `nn.EmbeddingBag(sparse=True)` make it. ZeRO cuts every gradient into dense rows and reduce-scatters
    them; the dense gradient holds the same values, so the step is the same, at the memory of a dense
    gradient (what the other parameters cost anyway)."""
    if p.grad is not None and p.grad.layout != torch.strided:
        p.grad = p.grad.to_dense()


def check_dense(params: Iterable[Tensor], names: dict[int, str], who: str) -> None:
    """A parameter that is itself a sparse tensor cannot be cut into rows: a ValueError naming it."""
    for p in params:
        if p.layout != torch.strided:
            raise ValueError(f"{who}: {names.get(id(p), 'a parameter')} is a sparse tensor ({p.layout}), and "
                             "ZeRO shards a parameter by its dense rows; keep sparse parameters out of it "
                             "(give them to a torch optimizer of their own), or make the parameter dense")
