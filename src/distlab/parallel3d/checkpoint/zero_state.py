"""Adam's state in ZeRO's flat layout, to and from one tensor per parameter (what a checkpoint stores).

Chapter 7's ZeRO lays each unit's parameters end to end in one flat buffer and gives dp-rank i the i-th
equal slice of it (Rajbhandari et al. 2020, sec. 5); the slice cuts across parameters, and on another
mesh the buffer itself differs (other tp slices, other pipeline stages, another padding). So a
checkpoint keeps Adam's exp_avg and exp_avg_sq per parameter, shaped and split like the parameter:
`zero_state` all-gathers each unit's state over dp (a transient copy, at save time only) and views it
parameter by parameter; `load_zero_state` lays the per-parameter state out again in this rank's layout
and keeps its own dp slice. Stage 0 keeps the whole state on every rank: nothing to gather or cut.
Both trainers of chapter 9 (`checkpoint.train.Trainer`, `train.Trainer3D`) use these two functions.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from distlab.dist_compat import all_gather_single
from distlab.memory.zero import ZeRO
from distlab.parallel3d.checkpoint.contract import ShardedParam

STATE_KEYS = ("exp_avg", "exp_avg_sq")


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def zero_state(zero: ZeRO, model: nn.Module, params: list[ShardedParam]) -> dict[str, list[ShardedParam]]:
    """Adam's state of every parameter of `model` (whose contract entries are `params`, by dense name):
    {"exp_avg": [ShardedParam], "exp_avg_sq": [...]}, each entry like its parameter's but holding the
    state. A collective over ZeRO's dp group (stages 1 and 2)."""
    names, by_name = _names(model), {p.name: p for p in params}
    out: dict[str, list[ShardedParam]] = {key: [] for key in STATE_KEYS}
    for unit in zero.units:
        for key, local in zip(STATE_KEYS, unit.adam.state_tensors(), strict=True):
            full = local
            if zero.stage > 0:
                full = torch.empty(unit.layout.padded_numel, dtype=local.dtype, device=local.device)
                all_gather_single(full, local, group=zero.group)
            for p, view in zip(unit.layout.params, unit.layout.views(full), strict=True):
                out[key].append(replace(by_name[names[id(p)]], local=view))
    return out


def load_zero_state(zero: ZeRO, model: nn.Module, state: dict[str, dict[str, Tensor]], steps: int) -> None:
    """Put per-parameter state ({key: {dense name: local tp shard}}) into ZeRO's flat dp shards, and set
    Adam's step count to `steps` (its bias correction depends on it)."""
    names = _names(model)
    for unit in zero.units:
        for key, local in zip(STATE_KEYS, unit.adam.state_tensors(), strict=True):
            flat = unit.layout.flatten([state[key][names[id(p)]] for p in unit.layout.params])
            local.copy_(flat if zero.stage == 0 else flat[unit.layout.shard_slice(zero.rank)])
        unit.adam.step_count = steps
