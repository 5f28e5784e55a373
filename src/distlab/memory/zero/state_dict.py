"""Optimizer state dicts of a sharded optimizer: whole (torch's format) and sharded, across dp sizes.

The *full* state dict is exactly what `torch.optim.<Optimizer>.state_dict()` returns on one process:
`{"state": {index: {"step": ..., "exp_avg": <tensor shaped like the parameter>, ...}}, "param_groups":
[...]}`, parameters numbered in the order of the parameter groups. So it loads into a `ShardedOptimizer`
on any number of ranks (each rank cuts its slices out of it), and into torch's optimizer on one process.

The *sharded* state dict is one rank's slices plus the sizes needed to put the ranks' pieces together
(`merge_sharded`): what each rank writes to its own file. To resume on another dp size, read every old
rank's file, merge, and `load_state_dict` the result (PyTorch's distributed checkpoint reshards the same
way, through the global shape it records; Zhao et al. 2023).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from distlab.dist_compat import all_gather_single

SCALAR_KEYS = ("step",)  # per-parameter counters, kept whole on every rank


def _params(opt: Any) -> list[Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def _is_sliced(key: str, value: Any, shard: Tensor) -> bool:
    return isinstance(value, Tensor) and key not in SCALAR_KEYS and value.shape == shard.shape


def saved_groups(opt: Any) -> list[dict[str, Any]]:
    """The parameter groups as torch saves them: hyper-parameters, and the parameters' indices."""
    out, start = [], 0
    for g in opt.param_groups:
        n = len(g["params"])
        out.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(start, start + n))})
        start += n
    return out


def full_state(opt: Any) -> dict[str, Any]:
    """The whole state of the `ShardedOptimizer` `opt`, in torch's format (a collective on its group)."""
    inner = opt.optim.state_dict()["state"]
    state: dict[int, dict[str, Any]] = {}
    for idx, p in enumerate(_params(opt)):
        if idx not in inner:
            continue
        shard = opt.shards[id(p)]
        state[idx] = {}
        for key, value in inner[idx].items():
            if not _is_sliced(key, value, shard):
                state[idx][key] = value.clone() if isinstance(value, Tensor) else value
                continue
            size = opt.where[id(p)][0].sizes[opt.where[id(p)][1]]
            mine = torch.zeros(size, dtype=value.dtype, device=value.device)  # padded: equal pieces
            mine[:value.numel()].copy_(value.reshape(-1))
            whole = torch.empty(opt.n * size, dtype=value.dtype, device=value.device)
            all_gather_single(whole, mine, group=opt.group)
            state[idx][key] = whole[:p.numel()].view(p.shape).clone()
    return {"state": state, "param_groups": saved_groups(opt)}


def sharded_state(opt: Any) -> dict[str, Any]:
    """This rank's slices of the state, with the group size, the rank and each parameter's shape."""
    inner = opt.optim.state_dict()
    return {"state": {i: {k: (v.clone() if isinstance(v, Tensor) else v) for k, v in s.items()}
                      for i, s in inner["state"].items()},
            "param_groups": saved_groups(opt), "world_size": opt.n, "rank": opt.rank,
            "shapes": [tuple(p.shape) for p in _params(opt)]}


def merge_sharded(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """The full state dict from every rank's `sharded_state_dict()` (any order; plain Python, no ranks)."""
    if not pieces:
        raise ValueError("pieces=[] holds no rank's state; pass the sharded_state_dict() of every rank")
    n = pieces[0]["world_size"]
    ranks = sorted(p["rank"] for p in pieces)
    if ranks != list(range(n)):
        raise ValueError(f"pieces hold ranks {ranks} of a group of {n}; pass the sharded_state_dict() of "
                         f"every rank 0..{n - 1}, once each")
    pieces = sorted(pieces, key=lambda p: p["rank"])
    state = {idx: _merge_entry(pieces, idx, shape) for idx, shape in enumerate(pieces[0]["shapes"])
             if idx in pieces[0]["state"]}
    return {"state": state, "param_groups": pieces[0]["param_groups"]}


def _merge_entry(pieces: list[dict[str, Any]], idx: int, shape: tuple) -> dict[str, Any]:
    """Parameter idx's state from every rank's slices (sorted by rank), its tensors joined whole."""
    numel = int(torch.Size(shape).numel())
    entry: dict[str, Any] = {}
    for key, value in pieces[0]["state"][idx].items():
        parts = [p["state"][idx][key] for p in pieces]
        sliced = isinstance(value, Tensor) and key not in SCALAR_KEYS
        if sliced and sum(t.numel() for t in parts) == numel:
            entry[key] = torch.cat([t.reshape(-1) for t in parts]).view(shape).clone()
        else:
            entry[key] = value
    return entry


def load_full_state(opt: Any, state_dict: dict[str, Any]) -> None:
    """Load the whole `state_dict` into the `ShardedOptimizer` `opt`: each rank keeps its own slices."""
    params = _params(opt)
    groups = state_dict.get("param_groups", [])
    sizes = [len(g["params"]) for g in groups]
    if sizes != [len(g["params"]) for g in opt.param_groups]:
        raise ValueError(f"state_dict has parameter groups of sizes {sizes}, but this optimizer's are "
                         f"{[len(g['params']) for g in opt.param_groups]}; load the state of the same model "
                         "built with the same parameter groups")
    sliced = {int(idx): {key: _slice_value(opt, params[int(idx)], idx, key, value)
                         for key, value in entry.items()}
              for idx, entry in state_dict["state"].items()}
    inner_groups = [{**g, "params": list(range(sum(sizes[:j]), sum(sizes[:j + 1])))}
                    for j, g in enumerate(groups)]
    opt.optim.load_state_dict({"state": sliced, "param_groups": inner_groups})
    for g, saved in zip(opt.param_groups, groups, strict=True):
        g.update({k: v for k, v in saved.items() if k != "params"})


def _slice_value(opt: Any, p: Tensor, idx: Any, key: str, value: Any) -> Any:
    """This rank's copy of parameter `p`'s state `key`: its slice of a per-element tensor, else the value."""
    if isinstance(value, Tensor) and key not in SCALAR_KEYS:
        if value.shape != p.shape:
            raise ValueError(f"state_dict['state'][{idx}][{key!r}] has shape {tuple(value.shape)} "
                             f"but parameter {idx} has {tuple(p.shape)}; load the state of the same "
                             "model")
        b, k = opt.where[id(p)]
        shard = opt.shards[id(p)]
        value = b.slice_of(value, k, opt.rank)[:shard.numel()].view(shard.shape)
    # a copy: the optimizer updates its state in place (AdamW's step += 1), the caller's dict stays
    return value.clone() if isinstance(value, Tensor) else value
