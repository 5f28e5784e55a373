"""How the chapter's `ZeRO` engine cuts a model into units, and each unit's buffers on this rank.

A *unit* is a group of parameters sharded, gathered and reduced together (Rajbhandari et al. 2020,
sec. 5; FSDP's "FlatParameter", Zhao et al. 2023): by default one per block of a GPT or per layer of an
`nn.Sequential` (`default_units`), plus a root unit for every parameter no other unit claims (embeddings,
the final norm), first in forward order. `unit_layouts` lays each unit out as a `flat.FlatUnit`; `build_unit`
allocates its buffers on this rank for a stage, as the table of `engine` says:

| stage | `flat` (whole parameters) | `shard` (what this rank updates) | gradient kept |
| --- | --- | --- | --- |
| 0 | kept | all of `flat` | `grad_full` |
| 1 | kept | a view of its 1/N of `flat` | `grad_full` |
| 2 | kept | a view of its 1/N of `flat` | `grad_shard` (1/N) |
| 3 | freed between uses (`stage3`) | a copy of its 1/N | `grad_shard` (1/N) |
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.memory.zero.flat import AdamConfig, FlatUnit, ShardAdam, shard_segments
from distlab.memory.zero.offload import HostShard


def default_units(model: nn.Module) -> list[nn.Module]:
    """The layers a model is sharded and gathered by: a GPT's blocks (`model.h`), or the children of an
    `nn.Sequential` that hold parameters; every other parameter goes to the root unit."""
    if isinstance(getattr(model, "h", None), nn.ModuleList):
        return list(model.h)
    if isinstance(model, nn.Sequential):
        return [m for m in model if any(True for _ in m.parameters())]
    return []


@dataclass
class Unit:
    """One unit's buffers on this rank. `flat`: the full parameters (stage 3: freed between uses);
    `shard`: the part this rank updates; `grad_full`/`grad_shard`: its gradient, whole or this rank's."""

    layout: FlatUnit
    module: nn.Module
    flat: Tensor
    shard: Tensor
    adam: ShardAdam
    host: HostShard | None = None
    grad_full: Tensor | None = None
    grad_shard: Tensor | None = None
    got: list[bool] = field(default_factory=list)  # parameter j's gradient is in grad_full (this pass)
    used: list[bool] = field(default_factory=list)  # parameter j got a gradient on this rank this step
    passes: int = 0  # stages 2-3: reduce-scatters already summed into grad_shard this step

    def forget(self) -> None:
        self.got = [False] * len(self.layout.params)
        self.used = list(self.got)
        self.passes = 0


def unit_layouts(model: nn.Module, units: list[nn.Module], n: int) -> tuple[list[FlatUnit], list[nn.Module]]:
    """One FlatUnit (cut into `n` shards) per unit module, the root (the model, with the parameters no
    unit claims) first; units without trainable parameters are left out."""
    _check_units_in_model(model, units)
    claimed, seen = _claimed_parameters(units)
    root = [p for p in model.parameters() if p.requires_grad and id(p) not in seen]
    pairs = [(FlatUnit(f"unit{i}", ps, n), m)
             for i, (ps, m) in enumerate(zip([root, *claimed], [model, *units], strict=True)) if ps]
    if not pairs:
        raise ValueError("the model has no trainable parameters; ZeRO has nothing to shard")
    return [u for u, _ in pairs], [m for _, m in pairs]


def _check_units_in_model(model: nn.Module, units: list[nn.Module]) -> None:
    """Every unit is a module of the model."""
    inside = {id(m) for m in model.modules()}
    strangers = [type(m).__name__ for m in units if id(m) not in inside]
    if strangers:
        raise ValueError(f"units {strangers} are not modules of the model; pass submodules of it, e.g. "
                         "units=list(model.h) for a GPT, or leave units=None")


def _claimed_parameters(units: list[nn.Module]) -> tuple[list[list[nn.Parameter]], set[int]]:
    """Each unit's trainable parameters that no unit before it claimed, and the ids of all of them."""
    seen: set[int] = set()
    claimed = []
    for m in units:
        ps = [p for p in m.parameters() if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in ps)
        claimed.append(ps)
    return claimed, seen


def build_unit(layout: FlatUnit, module: nn.Module, stage: int, group: dist.ProcessGroup | None,
               config: AdamConfig, offload: bool) -> Unit:
    """Unit `layout`'s buffers on this rank for `stage` (see the module docstring): group-rank 0's
    parameters broadcast to every rank, then bound as views of the flat buffer."""
    rank = dist.get_rank(group)
    flat = layout.flatten([p.detach() for p in layout.params])
    dist.broadcast(flat, group=group, group_src=0)  # every replica starts from group-rank 0's
    layout.bind(flat)
    sliced = flat if stage == 0 else flat[layout.shard_slice(rank)]
    shard = sliced.clone() if stage == 3 else sliced
    state_dtype = torch.promote_types(flat.dtype, torch.float32)  # fp32, or fp64 for a float64 model
    # where each parameter lies in what this rank updates (stage 0: the whole buffer)
    segments = shard_segments(FlatUnit(layout.name, layout.params, 1) if stage == 0 else layout,
                              0 if stage == 0 else rank)
    unit = Unit(layout, module, flat, shard, ShardAdam(0 if offload else shard.numel(), config, flat.device,
                                                       state_dtype, segments))
    unit.forget()
    if offload:
        unit.host = HostShard(shard, config)
        unit.host.adam.segments, unit.host.adam.steps = segments, [0] * len(segments)
    if stage <= 1:  # stages 0 and 1 keep the whole gradient, as plain DP does
        unit.grad_full = torch.zeros_like(flat)
    else:
        unit.grad_shard = torch.zeros_like(shard)
    return unit
