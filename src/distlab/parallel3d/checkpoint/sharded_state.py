"""A `ShardedOptimizer`'s state (chapter 7's ZeRO around `torch.optim.Adam`) to and from a checkpoint.

`ShardedOptimizer` cuts every parameter along dim 0 and gives dp-rank i the i-th slice (FSDP2's layout),
so its state is already kept per parameter, unlike the chapter's engine with its flat buffers
(`zero_state`). Its state dicts carry it across dp sizes: `state_dict()` is torch's format, one whole
(tp-local) tensor per parameter, put together from the dp slices (a collective, a transient copy, at save
time only); `sharded_state_dict()` is one rank's slices, and `state_dict.merge_sharded` puts the ranks'
pieces together without communication. A DCP checkpoint stores each tensor once per tp slice and
replicated over dp (`store`), so the save needs the whole tp-local tensor on the dp ranks: the whole
state dict. On load, `load_state_dict` cuts the slices of the *new* dp size out of it: a checkpoint
written at dp = 3 resumes at dp = 2 or 1 (and on another tp, which DCP reshards).

Adam's `step` is not stored per parameter: every parameter of the GPT steps at every step, so it is the
trainer's step count, which the checkpoint keeps anyway (`progress.step`).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from distlab.memory.zero import ShardedOptimizer
from distlab.memory.zero.state_dict import saved_groups
from distlab.parallel3d.checkpoint.contract import ShardedParam

STATE_KEYS = ("exp_avg", "exp_avg_sq")


def _named(opt: ShardedOptimizer, model: nn.Module) -> list[tuple[str, Tensor]]:
    """The optimizer's parameters in its order (torch's indices), with their names in `model`."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [(names[id(p)], p) for g in opt.param_groups for p in g["params"]]


def sharded_optimizer_state(opt: ShardedOptimizer, model: nn.Module,
                            params: list[ShardedParam]) -> dict[str, list[ShardedParam]]:
    """Adam's exp_avg and exp_avg_sq of every parameter of `model` (whose contract entries are `params`,
    by dense name), whole over dp, each entry like its parameter's but holding the state. A collective
    over the optimizer's dp group (`ShardedOptimizer.state_dict`)."""
    whole = opt.state_dict()["state"]
    by_name = {p.name: p for p in params}
    out: dict[str, list[ShardedParam]] = {key: [] for key in STATE_KEYS}
    for idx, (name, p) in enumerate(_named(opt, model)):
        for key in STATE_KEYS:  # before the first step there is no state: Adam's is zeros then
            value = whole[idx][key] if idx in whole else torch.zeros_like(p)
            out[key].append(replace(by_name[name], local=value))
    return out


def load_sharded_optimizer_state(opt: ShardedOptimizer, model: nn.Module, state: dict[str, dict[str, Tensor]],
                                 steps: int) -> None:
    """Load per-parameter state ({key: {dense name: local tp tensor}}, as `store.load` reads it) into
    `opt` on this dp size, with Adam's step count `steps` (its bias correction depends on it)."""
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"state has no {missing[0]!r}: pass Adam's state, {{'exp_avg': ..., 'exp_avg_sq': "
                         "...}, each {dense name: tensor}, as checkpoint.load reads it")
    entries = {}
    for idx, (name, p) in enumerate(_named(opt, model)):
        entries[idx] = {"step": torch.tensor(float(steps)),
                        **{key: state[key][name].reshape(p.shape) for key in STATE_KEYS}}
    opt.load_state_dict({"state": entries, "param_groups": saved_groups(opt)})
