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
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.utils._pytree import tree_map

from distlab.dist_compat import all_gather_single, reduce_scatter_single
from distlab.memory.zero.buckets import Bucket
from distlab.memory.zero.clip import clip_sharded_grads_
from distlab.memory.zero.flat import alloc_storage, free_storage
from distlab.memory.zero.state_dict import full_state, load_full_state
from distlab.memory.zero.uneven import agree_on_usage
from distlab.memory.zero.validate import check_group


class ShardedUnit:
    """The state of one `fully_shard`ed module on this rank (reached as `module.zero_unit`)."""

    def __init__(self, module: nn.Module, group: dist.ProcessGroup | None, mp: MixedPrecisionPolicy,
                 reshard_after_forward: bool) -> None:
        self.module, self.group, self.mp, self.reshard = module, group, mp, reshard_after_forward
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        owners: dict[int, list[tuple[nn.Module, str]]] = {}
        params: list[nn.Parameter] = []
        for sub in module.modules():
            for name, p in sub._parameters.items():
                if p is None or getattr(p, "_zero_shard", False):
                    continue  # a slice of a submodule's fully_shard
                if id(p) not in owners:
                    owners[id(p)] = []
                    params.append(p)
                owners[id(p)].append((sub, name))
        if not params:
            raise ValueError(f"module={type(module).__name__} has no parameters that are not already "
                             "sharded; call fully_shard on the blocks first and on the root last, once each")
        if len({p.dtype for p in params}) > 1:
            raise ValueError(f"module={type(module).__name__} mixes parameter dtypes "
                             f"{sorted({str(p.dtype) for p in params})}; make them one dtype (model.float())")
        self.bucket = Bucket(params, self.n)
        self.owners = [owners[id(p)] for p in params]
        self.compute_dtype = mp.param_dtype or params[0].dtype
        self.reduce_dtype = mp.reduce_dtype or self.compute_dtype
        master = torch.zeros(self.bucket.width, dtype=params[0].dtype, device=params[0].device)
        self.full: list[nn.Parameter] = []
        self.shards: list[nn.Parameter] = []
        for k, p in enumerate(params):
            dist.broadcast(p.detach(), group=group, group_src=0)  # every replica starts alike
            self.bucket.local(master, k).copy_(self.bucket.slice_of(p.detach(), k, self.rank))
            shard = nn.Parameter(self.bucket.local(master, k).view(self.bucket.shapes[k]),
                                 requires_grad=p.requires_grad)
            shard._zero_shard = True  # type: ignore[attr-defined]
            self.shards.append(shard)
            whole = nn.Parameter(torch.empty(p.shape, dtype=self.compute_dtype, device=p.device),
                                 requires_grad=p.requires_grad)
            free_storage(whole)
            self.full.append(whole)
        self.master = master
        self._swap(self.shards)
        self.gathered = False
        self.got: set[int] = set()
        self.used: set[int] = set()
        self.grad_buffer: Tensor | None = None
        self.pending: tuple[dist.Work, Tensor] | None = None
        self.final_queued = False
        self.hooks = [module.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
                      module.register_forward_hook(self._post_forward)]
        self.hooks += [w.register_post_accumulate_grad_hook(self._grad_hook(k))
                       for k, w in enumerate(self.full) if w.requires_grad]

    def _swap(self, tensors: list[nn.Parameter]) -> None:
        for t, owners in zip(tensors, self.owners, strict=True):
            for sub, name in owners:
                sub._parameters[name] = t

    # -- gathering
    def gather(self) -> None:
        """All-gather the whole parameters (in the compute dtype) and put them in place of the slices."""
        if self.gathered:
            self._swap(self.full)
            return
        b = self.bucket
        out = torch.empty(b.n, b.width, dtype=self.compute_dtype, device=self.master.device)
        all_gather_single(out.view(-1), self.master.to(self.compute_dtype), group=self.group)
        for k, w in enumerate(self.full):
            alloc_storage(w)
            b.copy_out(out, k, w.data)  # .data: a refill does not bump the version autograd saved
        self._swap(self.full)
        self.gathered = True

    def release(self) -> None:
        """Put the slices back and free the whole parameters."""
        self._swap(self.shards)
        for w in self.full:
            free_storage(w)
        self.gathered = False

    # -- the hooks
    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self.gather()
        if self.mp.cast_forward_inputs and self.mp.param_dtype is not None:
            cast = self.mp.param_dtype
            args, kwargs = tree_map(lambda t: t.to(cast) if isinstance(t, Tensor) and t.is_floating_point()
                                    else t, (args, kwargs))
        return args, kwargs

    def _post_forward(self, module: nn.Module, args: Any, out: Any) -> Any:
        self._swap(self.shards)  # between forwards the module shows its slices
        if torch.is_grad_enabled():
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(self._pre_backward)
        if self.reshard:
            self.release()
        if self.mp.output_dtype is not None:
            out = tree_map(lambda t: t.to(self.mp.output_dtype) if isinstance(t, Tensor) and
                           t.is_floating_point() else t, out)
        return out

    def _pre_backward(self, grad: Tensor) -> None:
        if not self.gathered:
            self.gather()
            self._swap(self.shards)
        if self.module is _root(self.module) and not self.final_queued:
            self.final_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._final)  # once per backward

    def _grad_hook(self, k: int):
        def hook(w: Tensor) -> None:
            if self.grad_buffer is None:
                b = self.bucket
                self.grad_buffer = torch.zeros(b.n, b.width, dtype=self.reduce_dtype, device=w.device)
            self.bucket.copy_in(self.grad_buffer, k, w.grad)
            w.grad = None
            self.got.add(k)
            self.used.add(k)
            if len(self.got) == len(self.full):
                self.reduce()
        return hook

    def reduce(self) -> None:
        """Reduce-scatter this pass's gradient buffer (async); free the whole parameters."""
        self.finish()
        if self.grad_buffer is None:
            b = self.bucket
            self.grad_buffer = torch.zeros(b.n, b.width, dtype=self.reduce_dtype, device=self.master.device)
        out = torch.empty(self.bucket.width, dtype=self.reduce_dtype, device=self.master.device)
        work = reduce_scatter_single(out, self.grad_buffer.view(-1), group=self.group, async_op=True)
        self.pending = (work, out)
        self.grad_buffer = None
        self.got.clear()
        self.release()

    def finish(self) -> None:
        """Wait for the reduce-scatter in flight and add it (averaged, master dtype) to the slices' grads."""
        if self.pending is None:
            return
        work, out = self.pending
        self.pending = None
        work.wait()
        out = out.div_(self.n).to(self.master.dtype)
        for k, s in enumerate(self.shards):
            piece = self.bucket.local(out, k).view(s.shape)
            s.grad = piece.clone() if s.grad is None else s.grad.add_(piece)

    def _final(self) -> None:
        """End of a backward, run once by the root: finish every unit, drop gradients nobody computed."""
        self.final_queued = False
        units = list(_units(self.module))
        used = agree_on_usage([k in u.used for u in units for k in range(len(u.full))],
                              [_name(self.module, sub, name) for u in units for (sub, name), *_ in u.owners],
                              self.group, device=units[0].master.device,  # NCCL: tensors on the GPU
                              who="fully_shard (ZeRO stage 3)")
        start = 0
        for u in units:
            flags = used[start:start + len(u.full)]
            start += len(u.full)
            if u.got or (any(flags) and not u.used):
                u.reduce()
            u.finish()
            for k, flag in enumerate(flags):
                if not flag:
                    u.shards[k].grad = None
            u.used.clear()
            if u.gathered:
                u.release()


def _tensors(out: Any) -> list[Tensor]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [t for t in items if isinstance(t, Tensor)]


def _units(root: nn.Module) -> Iterator[ShardedUnit]:
    for m in root.modules():
        unit = getattr(m, "zero_unit", None)
        if isinstance(unit, ShardedUnit):
            yield unit


def _root(module: nn.Module) -> nn.Module:
    return module.__dict__.get("_zero_root", module)


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


def _name(model: nn.Module, sub: nn.Module, name: str) -> str:
    for prefix, m in model.named_modules():
        if m is sub:
            return f"{prefix}.{name}" if prefix else name
    raise ValueError(f"sub={type(sub).__name__} is not a module of model")
