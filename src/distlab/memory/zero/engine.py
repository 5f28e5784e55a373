"""ZeRO stages 0-3 from scratch, on the data-parallel group (Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", SC'20).

Plain data parallelism keeps a full copy of the model states on each of the N ranks: parameters,
gradients and the optimizer's state. ZeRO's data-parallel stages cut them into N shards instead, one per
rank, and get each piece to where it is needed with collectives that cost (almost) no more than the
all-reduce they replace:

| stage | sharded | after the backward | step | communication per rank |
| --- | --- | --- | --- | --- |
| 0 | nothing (plain DP) | all-reduce the gradients | Adam on everything | 2 Psi |
| 1 (P_os) | optimizer state | reduce-scatter the gradients | Adam on my shard, all-gather params | 2 Psi |
| 2 (P_os+g) | + gradients | reduce-scatter each unit's as soon as it is ready | as stage 1 | 2 Psi |
| 3 (P_os+g+p) | + parameters | (gather each unit before forward and backward) | Adam on my shard | 3 Psi |

`ZeRO(model, stage, group=...)` takes the place of the optimizer: build it after the model, then per step
`loss.backward(); zero.step(); zero.zero_grad()`. Its Adam equals `torch.optim.Adam`. With
`hook_gradients=False` (stages 0-2) nothing happens during the backward; `take_gradients()` then takes the
accumulated `.grad`s, as a pipeline needs (chapter 9). Parameters are laid
out by *unit* (`flat.FlatUnit`: one flat, padded buffer per layer, plus a root unit for the rest),
each cut into N equal shards; group-rank i owns shard i of every unit. Gradients are taken by a
post-accumulate hook per parameter (`Tensor.register_post_accumulate_grad_hook`), copied into their
unit's flat gradient buffer; in stages 2 and 3 the unit is reduce-scattered as soon as its last gradient
arrives, asynchronously so that the backward goes on meanwhile (one unit in flight at a time), and only
the shard is kept. How the model is cut into units and what each holds is in `units`; stage 3's schedule
of all-gathers is in `stage3`. Every collective is labelled with its unit (`distlab.comm_log.where`), so
that a `comm_log` opened around a step counts ZeRO's bytes (`accounting.zero_sent_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import where
from distlab.dist_compat import all_gather_single, reduce_scatter_single
from distlab.memory.zero.flat import AdamConfig, FlatUnit
from distlab.memory.zero.offload import HOST_BYTES_PER_ELEMENT, check_host_room
from distlab.memory.zero.stage3 import ParameterGather
from distlab.memory.zero.uneven import CONTROL, agree_on_usage
from distlab.memory.zero.units import build_unit, default_units, unit_layouts
from distlab.memory.zero.validate import STAGES, check_group, check_stage, densify_grad, dp_group

__all__ = ["CONTROL", "STAGES", "ZeRO", "check_group", "check_stage", "default_units", "dp_group"]


def _check_hook_gradients(hook_gradients: bool, stage: int) -> None:
    """Stage 3 needs the gradient hooks."""
    if not hook_gradients and stage == 3:
        raise ValueError("hook_gradients=False with stage=3: stage 3 gathers and frees each unit's "
                         "parameters around its own backward, so its gradients must be taken as they "
                         "arrive; use hook_gradients=True, or stage 0, 1 or 2")


def _check_offload_room(layouts: list[FlatUnit], stage: int,
                        host_bytes_available: int | Callable[[], int] | None) -> None:
    """ZeRO-Offload: the host has room for this rank's master shard and Adam's state (stage 0: of
    everything)."""
    per_rank = layouts if stage else [FlatUnit(u.name, u.params, 1) for u in layouts]
    check_host_room(HOST_BYTES_PER_ELEMENT * sum(u.shard_numel for u in per_rank), host_bytes_available)


class ZeRO:
    """ZeRO data parallelism of `stage` 0-3 with Adam, over `group` (None: the whole world).

    Every rank of `group` must build it on the same model (group-rank 0's parameters are broadcast).
    `units`: the modules sharded and gathered one at a time (default `default_units`). `offload=True`
    keeps the fp32 master shard and Adam's state on the host (ZeRO-Offload, `offload.HostShard`);
    `host_bytes_available` (bytes, or a function returning them) replaces the measured free host memory.
    """

    def __init__(self, model: nn.Module, stage: int, group: dist.ProcessGroup | None = None, *,
                 lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, units: Sequence[nn.Module] | None = None,
                 prefetch: bool = True, offload: bool = False,
                 host_bytes_available: int | Callable[[], int] | None = None,
                 hook_gradients: bool = True) -> None:
        self.stage = check_stage(stage)
        _check_hook_gradients(hook_gradients, self.stage)
        check_group(group)
        self.model, self.group = model, group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.config = AdamConfig(lr, tuple(betas), eps, weight_decay)
        self.in_flight: tuple[int, dist.Work, Tensor] | None = None  # stages 2-3: the one under way
        layouts, modules = unit_layouts(model, default_units(model) if units is None else list(units), self.n)
        if offload:
            _check_offload_room(layouts, self.stage, host_bytes_available)
        self.units = [build_unit(layout, module, self.stage, group, self.config, offload)
                      for layout, module in zip(layouts, modules, strict=True)]
        self.gather = self._stage3_gather(modules, prefetch) if self.stage == 3 else None
        self.hooks = [p.register_post_accumulate_grad_hook(self._grad_hook(i, j))
                      for i, u in enumerate(self.units) for j, p in enumerate(u.layout.params)
                      if hook_gradients]

    def _stage3_gather(self, modules: list[nn.Module], prefetch: bool) -> ParameterGather:
        """Stage 3: the schedule that gathers each unit's parameters before its forward and backward."""
        names = {id(m): name for name, m in self.model.named_modules()}
        return ParameterGather(modules, [u.flat for u in self.units], [u.shard for u in self.units],
                               self.group, prefetch, has_root=modules[0] is self.model,
                               names=[names[id(m)] or "the root" for m in modules])

    # -- the backward: gradients into flat buffers, reduce-scattered per unit in stages 2 and 3
    def _grad_hook(self, i: int, j: int) -> Callable[[Tensor], None]:
        def hook(p: Tensor) -> None:
            densify_grad(p)  # nn.Embedding(sparse=True): the same values, in dense rows
            unit = self.units[i]
            if unit.grad_full is None:
                unit.grad_full = torch.zeros_like(unit.flat, memory_format=torch.contiguous_format)
            view = unit.layout.views(unit.grad_full)[j]
            if p.grad.data_ptr() != view.data_ptr():  # stages 0-1 after the first pass: autograd added
                view.add_(p.grad) if unit.got[j] else view.copy_(p.grad)  # into the view itself
            p.grad = view if self.stage <= 1 else None
            unit.got[j] = unit.used[j] = True
            if self.stage >= 2 and all(unit.got):  # a second backward before step() accumulates
                self._reduce_scatter(i)
        return hook

    def take_gradients(self) -> None:
        """With `hook_gradients=False`: hand ZeRO the gradients now in `.grad`, last unit first, doing
        once what the hooks do during a backward. For gradients accumulated over several backward passes
        (a pipeline's micro-batches): a hook would reduce-scatter a stage-2 unit after the first one."""
        for i in reversed(range(len(self.units))):
            for j, p in enumerate(self.units[i].layout.params):
                if p.grad is not None:
                    self._grad_hook(i, j)(p)

    def _reduce_scatter(self, i: int) -> None:
        """Start unit i's reduce-scatter (async, so the backward goes on); first finish the one before,
        so that at most one unit's full gradient buffer is alive besides the one being filled."""
        self._finish_reduce()
        unit = self.units[i]
        if unit.grad_full is None:  # no parameter of the unit got a gradient in this pass
            unit.grad_full = torch.zeros_like(unit.flat, memory_format=torch.contiguous_format)
        into = unit.grad_shard if unit.passes == 0 else torch.empty_like(unit.grad_shard)
        with where(unit.layout.name):
            work = reduce_scatter_single(into, unit.grad_full, group=self.group, async_op=True)
        self.in_flight = (i, work, into)
        unit.got = [False] * len(unit.layout.params)
        unit.passes += 1
        if self.gather is not None:
            self.gather.mark_backward_done(i)

    def _finish_reduce(self) -> None:
        """Wait for the reduce-scatter in flight, average its shard, free the full gradient."""
        if self.in_flight is None:
            return
        i, work, into = self.in_flight
        self.in_flight = None
        work.wait()
        unit = self.units[i]
        into.div_(self.n)
        if into is not unit.grad_shard:  # gradient accumulation: later passes add to the first
            unit.grad_shard.add_(into)
        unit.grad_full = None  # stages 2 and 3 keep only the shard
        if unit.host is not None:
            unit.host.grad_to_host(unit.grad_shard)

    # -- the step
    def _averaged_grad(self, i: int) -> Tensor:
        """Unit i's gradient averaged over the group, for this rank's shard (stage 0: all of it)."""
        unit = self.units[i]
        if self.stage <= 1:  # a parameter with no gradient this step must not add a stale one
            if unit.grad_full is None:
                unit.grad_full = torch.zeros_like(unit.flat, memory_format=torch.contiguous_format)
            for view, used in zip(unit.layout.views(unit.grad_full), unit.used, strict=True):
                if not used:
                    view.zero_()
        if self.stage == 0:
            with where(unit.layout.name):
                dist.all_reduce(unit.grad_full, group=self.group)
            return unit.grad_full.div_(self.n)
        if self.stage == 1:
            shard = torch.empty_like(unit.shard)
            with where(unit.layout.name):
                reduce_scatter_single(shard, unit.grad_full, group=self.group)
            return shard.div_(self.n)
        return unit.grad_shard  # stages 2 and 3: reduce-scattered during the backward

    @torch.no_grad()
    def step(self) -> None:
        """Average the gradients over the group, update this rank's shard with Adam, and (stages 1-2)
        all-gather the parameters so that every replica holds the new model."""
        if self.gather is not None:  # nothing stays gathered across the step: the shards are about to change
            self.gather.release_all()
        if self.stage >= 2:
            for i, unit in enumerate(self.units):
                if any(unit.got) or unit.passes == 0:  # a unit some parameter of which got no gradient
                    self._reduce_scatter(i)
            self._finish_reduce()
        active = self._active()
        for i, unit in enumerate(self.units):
            grad = self._averaged_grad(i)
            if unit.host is not None:
                if self.stage <= 1:
                    unit.host.grad_to_host(grad)
                unit.host.step_into(unit.shard, active[i])
            else:
                unit.adam.step(unit.shard, grad, active[i])
            if self.stage in (1, 2):
                with where(unit.layout.name):
                    all_gather_single(unit.flat, unit.shard.clone(), group=self.group)
            unit.forget()

    def _active(self) -> list[list[bool]]:
        """Per unit and parameter: did it get a gradient on any rank this step? torch.optim skips a
        parameter whose .grad is None; ZeRO does the same for one that got no gradient anywhere. One
        all-reduce of a flag per parameter, a control message outside the paper's volume, labelled CONTROL
        in any open `distlab.comm_log`, so that byte counts leave it out (`accounting.zero_sent_bytes`).
        A parameter with a gradient on some ranks only is a RuntimeError on every rank (`uneven`)."""
        names = {id(p): name for name, p in self.model.named_parameters()}
        flags = agree_on_usage([u for unit in self.units for u in unit.used],
                               [names.get(id(p), "?") for unit in self.units for p in unit.layout.params],
                               self.group, device=self.units[0].flat.device, who=f"ZeRO stage {self.stage}")
        out, k = [], 0
        for unit in self.units:
            m = len(unit.layout.params)
            out.append(flags[k:k + m])
            k += m
        return out

    def zero_grad(self) -> None:
        """Forget this step's gradients (the buffers stay allocated, as DDP's buckets do)."""
        for unit in self.units:
            for p in unit.layout.params:
                p.grad = None
            unit.forget()

    def state_tensors(self) -> list[Tensor]:
        """The tensors this rank keeps across steps: each unit's flat parameters (stage 3: freed between
        uses), its shard (stage 3: a copy), its gradient buffer and Adam's state (for memory accounting)."""
        out = []
        for u in self.units:
            out += [u.flat, u.shard, *(t for t in (u.grad_full, u.grad_shard) if t is not None)]
            out += u.adam.state_tensors()
        return out

    # -- reading the model back
    def full_parameters(self) -> dict[str, Tensor]:
        """Every parameter, whole, by name (a collective in stage 3: call it on every rank)."""
        if self.gather is not None:
            self.gather.gather_all()
        out = {name: p.detach().clone() for name, p in self.model.named_parameters()}
        if self.gather is not None:
            self.gather.release_all()
        return out

    def parameter_count(self, padded: bool = False) -> int:
        """Psi: the number of trainable parameters (or of elements including the padding)."""
        return sum(u.layout.padded_numel if padded else u.layout.numel for u in self.units)

    def remove(self) -> None:
        """Take the hooks off the model."""
        for h in self.hooks:
            h.remove()
        if self.gather is not None:
            self.gather.remove()
