"""ZeRO stage 3 as a per-module wrapper, in the spirit of FSDP2: `fully_shard(block, group=...)`.

`fully_shard(module)` replaces every parameter of `module` (those not already claimed by a
`fully_shard` on a submodule) by this rank's slice of it: an `nn.Parameter` of ceil(rows / N) rows of
dim 0 (FSDP2's `Shard(0)`, padded with zero rows), kept in full precision, the *master shard*
(Rajbhandari et al. 2020, sec. 5.3, P_os+g+p; Zhao et al. 2023 for FSDP). `model.parameters()` then
yields the slices, so any element-wise torch optimizer built on
them is ZeRO-3's optimizer: `torch.optim.AdamW(model.parameters(), lr=...)`. Around the module's work:

- before its forward: cast the shards to the compute dtype, all-gather them (one call for the module,
  `buckets.Bucket`'s rank-major layout) and put the whole parameters in place of the slices;
- after its forward: put the slices back and free the whole parameters (unless
  `reshard_after_forward=False`); a hook on the output gathers them again when the backward reaches it;
- in the backward: as each whole parameter's gradient is accumulated, pack it into a buffer of the reduce
  dtype; when the module's last one is in, reduce-scatter it (asynchronously) and free the whole
  parameters. At the end of the backward each slice's `.grad` holds this rank's slice of the gradient,
  averaged over the group, in the master dtype (several backward passes add up, as autograd's do).

Mixed precision takes torch's own `MixedPrecisionPolicy(param_dtype, reduce_dtype, output_dtype,
cast_forward_inputs)`, with FSDP2's meanings: compute in `param_dtype`, reduce the gradients in
`reduce_dtype` (default: `param_dtype`), update the fp32 master shards. A parameter that got no gradient on
any rank keeps `.grad = None`, so the optimizer skips it as torch's does. `clip_grad_norm_(model, ...)`
clips by the global norm; `full_parameters(model)` gathers the whole model (a collective);
`optimizer_state_dict` / `load_optimizer_state_dict` give and take the optimizer's whole state in torch's
format, so that a run resumes on another number of ranks.

This file is the API on a whole model; what happens around one module's forward and backward is
`fsdp_unit.ShardedUnit`. Every rank must run the same modules in the same order: before each gather the
ranks agree on the module (`order`), and a rank that skips a block makes every rank raise a RuntimeError
that names it, instead of a hang.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from distlab.dist_compat import all_gather_single
from distlab.memory.zero.clip import clip_sharded_grads_
from distlab.memory.zero.fsdp_unit import ShardedUnit, _units
from distlab.memory.zero.fsdp_unit import param_name as _name
from distlab.memory.zero.state_dict import full_state, load_full_state
from distlab.memory.zero.validate import check_group

__all__ = ["clip_grad_norm_", "full_parameters", "fully_shard", "load_optimizer_state_dict",
           "optimizer_state_dict"]


def fully_shard(module: nn.Module, *, group: dist.ProcessGroup | None = None,
                mp_policy: MixedPrecisionPolicy | None = None,
                reshard_after_forward: bool = True) -> nn.Module:
    """Shard `module`'s parameters over `group` (ZeRO-3); call it on each block, then on the root. Returns
    `module`, whose parameters are now this rank's slices. See the module docstring."""
    check_group(group)
    if isinstance(getattr(module, "zero_unit", None), ShardedUnit):
        raise ValueError(f"module={type(module).__name__} is already sharded; call fully_shard once per "
                         "module")
    unit = ShardedUnit(module, group, mp_policy or MixedPrecisionPolicy(), reshard_after_forward)
    module.zero_unit = unit  # type: ignore[assignment]
    for sub in module.modules():  # the last call is the root: it ends every backward
        object.__setattr__(sub, "_zero_root", module)  # not a submodule: no cycle in modules()
    return module


def clip_grad_norm_(model: nn.Module, max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Clip the gradient of a `fully_shard`ed model by its global norm (a collective on its group), as
    `torch.nn.utils.clip_grad_norm_` does on one process; returns the norm before clipping."""
    units = list(_units(model))
    grads = [s.grad for u in units for s in u.shards if s.grad is not None]
    return clip_sharded_grads_(grads, max_norm, norm_type, units[0].group)


@torch.no_grad()
def full_parameters(model: nn.Module) -> dict[str, Tensor]:
    """Every parameter of a `fully_shard`ed model, whole and in the master dtype, by its original name."""
    out: dict[str, Tensor] = {}
    for u in _units(model):
        b = u.bucket
        whole = torch.empty(b.n, b.width, dtype=u.master.dtype, device=u.master.device)
        all_gather_single(whole.view(-1), u.master, group=u.group)
        for k, owners in enumerate(u.owners):
            t = torch.empty(u.full[k].shape, dtype=u.master.dtype, device=u.master.device)
            b.copy_out(whole, k, t)
            for sub, name in owners:
                out[_name(model, sub, name)] = t
    return dict(sorted(out.items()))


class _OptimizerView:
    """A torch optimizer over a `fully_shard`ed model's slices, seen as `state_dict` sees a
    `ShardedOptimizer`: for each whole parameter (its shape), its slice, its place in a bucket."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        units = list(_units(model))
        whole_of = {id(s): (u, k) for u in units for k, s in enumerate(u.shards)}
        self.optim, self.group = optimizer, units[0].group
        self.n, self.rank = units[0].n, units[0].rank
        self.param_groups, self.shards, self.where = [], {}, {}
        for g in optimizer.param_groups:
            wholes = []
            for s in g["params"]:
                if id(s) not in whole_of:
                    raise ValueError("optimizer holds a parameter that is not a slice of this model; build "
                                     "it on model.parameters() after fully_shard")
                u, k = whole_of[id(s)]
                wholes.append(u.full[k])  # its storage may be freed; its shape is the parameter's
                self.shards[id(u.full[k])], self.where[id(u.full[k])] = s, (u.bucket, k)
            self.param_groups.append({**g, "params": wholes})


def optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole state of `optimizer` (any torch optimizer over the `fully_shard`ed `model`'s slices) in
    torch's one-process format: loadable on any number of ranks by `load_optimizer_state_dict`. A
    collective on the model's group."""
    return full_state(_OptimizerView(model, optimizer))


def load_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer,
                              state_dict: dict[str, Any]) -> None:
    """Load a whole optimizer state (from `optimizer_state_dict` on any number of ranks, or from torch's
    optimizer on one process): each rank keeps its slices."""
    load_full_state(_OptimizerView(model, optimizer), state_dict)
