"""One `fully_shard`ed module on this rank: its slices, its whole parameters, and what happens around
its forward and backward (ZeRO stage 3, Rajbhandari et al. 2020, sec. 5.3; FSDP2, Zhao et al. 2023).

`ShardedUnit` (reached as `module.zero_unit`) holds the module's parameters as one `buckets.Bucket`: the
master slices this rank owns (the `nn.Parameter`s the optimizer sees) and the whole parameters in the
compute dtype, allocated only while the module runs. Its hooks:

- before the forward: the ranks agree on the unit (`order.agree_on_unit`), then all-gather it and put
  the whole parameters in place of the slices;
- after the forward: the slices go back, the whole parameters are freed (`reshard_after_forward`), and a
  hook on the output gathers them again when the backward reaches it (the first unit it reaches, the
  ranks agree on once more: a rank that stopped early, having skipped the last blocks, is caught there);
- in the backward: each whole gradient is packed into the reduce buffer; when the last one is in, it is
  reduce-scattered (asynchronously) and the whole parameters freed; at the end of the backward the root
  finishes every unit and drops the gradients no rank computed (`uneven.agree_on_usage`).

`fsdp` builds it (`fully_shard`) and reads a sharded model back (`full_parameters`, clipping, the
optimizer's state).
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
from distlab.memory.zero.flat import alloc_storage, free_storage
from distlab.memory.zero.order import agree_on_unit
from distlab.memory.zero.uneven import agree_on_usage


def _own_parameters(module: nn.Module) -> tuple[dict[int, list[tuple[nn.Module, str]]], list[nn.Parameter]]:
    """The module's parameters that no submodule's fully_shard holds, each once, and where each sits
    (id -> every (submodule, name) it is registered under: a tied weight is in several places)."""
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
    return owners, params


def _check_parameters(module: nn.Module, params: list[nn.Parameter]) -> None:
    """Something left to shard, in one dtype."""
    if not params:
        raise ValueError(f"module={type(module).__name__} has no parameters that are not already "
                         "sharded; call fully_shard on the blocks first and on the root last, once each")
    if len({p.dtype for p in params}) > 1:
        raise ValueError(f"module={type(module).__name__} mixes parameter dtypes "
                         f"{sorted({str(p.dtype) for p in params})}; make them one dtype (model.float())")


class ShardedUnit:
    """The state of one `fully_shard`ed module on this rank (reached as `module.zero_unit`)."""

    def __init__(self, module: nn.Module, group: dist.ProcessGroup | None, mp: MixedPrecisionPolicy,
                 reshard_after_forward: bool) -> None:
        self.module, self.group, self.mp, self.reshard = module, group, mp, reshard_after_forward
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        owners, params = _own_parameters(module)
        _check_parameters(module, params)
        self.bucket = Bucket(params, self.n)
        self.owners = [owners[id(p)] for p in params]
        self.compute_dtype = mp.param_dtype or params[0].dtype
        self.reduce_dtype = mp.reduce_dtype or self.compute_dtype
        self.master, self.shards, self.full = self._slices(params)
        self._swap(self.shards)
        self.gathered = False
        self.got: set[int] = set()
        self.used: set[int] = set()
        self.grad_buffer: Tensor | None = None
        self.pending: tuple[dist.Work, Tensor] | None = None
        self.final_queued = False
        self.position: tuple[int, list[str]] | None = None  # this unit's index under its root, all names
        self.backward_agreed = True  # the root's: the ranks agreed on where this backward begins
        self.hooks = [module.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
                      module.register_forward_hook(self._post_forward)]
        self.hooks += [w.register_post_accumulate_grad_hook(self._grad_hook(k))
                       for k, w in enumerate(self.full) if w.requires_grad]

    def _slices(self, params: list[nn.Parameter]) -> tuple[Tensor, list[nn.Parameter], list[nn.Parameter]]:
        """Group-rank 0's parameters broadcast; this rank's slices of them in one master buffer (the
        parameters the optimizer sees), and the whole parameters in the compute dtype, not yet allocated."""
        master = torch.zeros(self.bucket.width, dtype=params[0].dtype, device=params[0].device)
        full: list[nn.Parameter] = []
        shards: list[nn.Parameter] = []
        for k, p in enumerate(params):
            dist.broadcast(p.detach(), group=self.group, group_src=0)  # every replica starts alike
            self.bucket.local(master, k).copy_(self.bucket.slice_of(p.detach(), k, self.rank))
            shard = nn.Parameter(self.bucket.local(master, k).view(self.bucket.shapes[k]),
                                 requires_grad=p.requires_grad)
            shard._zero_shard = True  # type: ignore[attr-defined]
            shards.append(shard)
            whole = nn.Parameter(torch.empty(p.shape, dtype=self.compute_dtype, device=p.device),
                                 requires_grad=p.requires_grad)
            free_storage(whole)
            full.append(whole)
        return master, shards, full

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
    def _agree(self, phase: str) -> None:
        """Before a gather: every rank of the group is about to run this unit (`order`), or all raise."""
        if self.position is None:  # the root is known once fully_shard has been called on it
            root = _root(self.module)
            units = list(_units(root))
            self.position = units.index(self), [module_name(root, u.module) or "the root" for u in units]
        index, names = self.position
        agree_on_unit(index, phase, names, self.group, self.master.device, who="fully_shard (ZeRO stage 3)")

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self._agree("forward")
        _root(self.module).zero_unit.backward_agreed = False
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
        root = _root(self.module).zero_unit
        if not root.backward_agreed:  # the first unit the backward reaches
            root.backward_agreed = True
            self._agree("backward")
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
                              [param_name(self.module, sub, name)
                               for u in units for (sub, name), *_ in u.owners],
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
    """The `ShardedUnit`s of `root` and its submodules, in `modules()` order."""
    for m in root.modules():
        unit = getattr(m, "zero_unit", None)
        if isinstance(unit, ShardedUnit):
            yield unit


def _root(module: nn.Module) -> nn.Module:
    return module.__dict__.get("_zero_root", module)


def param_name(model: nn.Module, sub: nn.Module, name: str) -> str:
    """The name in `model` of parameter `name` of its submodule `sub`."""
    for prefix, m in model.named_modules():
        if m is sub:
            return f"{prefix}.{name}" if prefix else name
    raise ValueError(f"sub={type(sub).__name__} is not a module of model")


def module_name(model: nn.Module, sub: nn.Module) -> str:
    """The name of submodule `sub` in `model` ("" for `model` itself)."""
    for prefix, m in model.named_modules():
        if m is sub:
            return prefix
    raise ValueError(f"sub={type(sub).__name__} is not a module of model")
