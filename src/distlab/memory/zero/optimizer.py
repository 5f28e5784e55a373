"""ZeRO stages 1 and 2 around any torch optimizer: `ShardedOptimizer(params, torch.optim.AdamW, ...)`.

This is what `torch.distributed.optim.ZeroRedundancyOptimizer` offers, built the way the ZeRO paper
describes (Rajbhandari et al. 2020, sec. 5.1-5.2). Group-rank i owns the i-th slice of every parameter
(`buckets.Bucket`); the given optimizer class runs on this rank's slices only, so its state (AdamW's two
moments, SGD's momentum) is 1/N of the whole. Per step:

- stage 1 (P_os): after the backward every `p.grad` holds this rank's own, whole gradient. `step()`
  reduce-scatters them (one call per bucket) so that each rank gets its slices of the averaged gradient;
- stage 2 (P_os+g): a hook per parameter packs its gradient into its bucket as it arrives and
  reduce-scatters the bucket as soon as it is full, while the backward goes on; `p.grad` is then None and
  the rank keeps only its slice (`grad_shard(p)`). Several backward passes before `step()` add up;
- then the inner optimizer steps on the slices, and one all-gather per bucket brings every replica the
  new parameters.

A parameter that got no gradient on any rank gets `.grad = None` on its slice, so the inner optimizer
skips it exactly as on one process. One that got a gradient on some ranks only is an error on every rank
(`uneven.agree_on_usage`), found before any bucket could be reduced out of step: stage 2 reduces the
buckets in one order, each as soon as it and all before it are full, and the rest at the end of the
backward, so every rank issues the same collectives whatever it used, and then compares.
Parameter groups (their own lr, weight_decay, ...) are kept: slice groups mirror them, and
`param_groups` is the user's, so learning-rate schedulers work. Optimizers that work element by element
(SGD, Adam, AdamW, RMSprop, Adagrad...) give the same result on slices (rows of dim 0, `buckets`) as on
whole tensors; one that reads a tensor's shape (Adafactor) does not, and is
refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.dist_compat import all_gather_single, reduce_scatter_single
from distlab.memory.zero.buckets import Bucket, make_buckets
from distlab.memory.zero.clip import clip_sharded_grads_
from distlab.memory.zero.state_dict import full_state, load_full_state, sharded_state
from distlab.memory.zero.uneven import agree_on_usage
from distlab.memory.zero.validate import check_group

SHAPE_AWARE = ("Adafactor", "Muon", "LBFGS", "SparseAdam")  # these read a parameter's shape or history


class ShardedOptimizer(torch.optim.Optimizer):
    """`optimizer_class` (e.g. `torch.optim.AdamW`) with its state sharded over `group`: ZeRO `stage`
    1 or 2. `params` are parameters or parameter groups, as for any torch optimizer; `**defaults` are the
    optimizer's keyword arguments (lr, weight_decay, ...). Every rank of `group` builds it on the same
    model; the parameters of group-rank 0 are broadcast. `bucket_numel`: elements per collective."""

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer], *,
                 group: dist.ProcessGroup | None = None, stage: int = 1, bucket_numel: int = 1 << 22,
                 **defaults: Any) -> None:
        if stage not in (1, 2) or isinstance(stage, bool):
            raise ValueError(f"stage={stage!r}: ShardedOptimizer is ZeRO stage 1 or 2; for stage 3 shard "
                             "the model with distlab.memory.zero.fsdp.fully_shard and give its parameters to "
                             "any optimizer")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_class={optimizer_class!r} is not a torch optimizer class; pass "
                             "one, e.g. torch.optim.AdamW")
        if optimizer_class.__name__ in SHAPE_AWARE:
            raise ValueError(f"optimizer_class={optimizer_class.__name__} reads each parameter's shape, "
                             "which a flat slice does not have; use an element-wise optimizer (SGD, Adam, "
                             "AdamW...)")
        check_group(group)
        super().__init__(params, defaults)
        self.group, self.stage = group, stage
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        everything = [p for g in self.param_groups for p in g["params"]]
        self.names = {id(p): name for g in self.param_groups for p, name in
                      zip(g["params"], g.get("param_names", [None] * len(g["params"])), strict=True)}
        for k, p in enumerate(everything):  # named_parameters() gives names; a plain list, positions
            self.names[id(p)] = self.names[id(p)] or f"parameter {k} of shape {tuple(p.shape)}"
        for p in everything:
            dist.broadcast(p.detach(), group=group, group_src=0)  # every replica starts alike
        self.buckets = make_buckets(list(reversed(everything)), self.n, bucket_numel)  # backward order
        self.where: dict[int, tuple[Bucket, int]] = {}
        # id(param) -> this rank's slice of it, a view of the parameter itself: what the optimizer sees.
        # Being a view, it follows the parameter when a checkpoint is loaded into the model.
        self.shards: dict[int, nn.Parameter] = {}
        for b in self.buckets:
            for k, p in enumerate(b.params):
                self.where[id(p)] = (b, k)
                self.shards[id(p)] = nn.Parameter(b.own(p.detach(), k, self.rank),
                                                  requires_grad=p.requires_grad)
        inner = [{**{k: v for k, v in g.items() if k != "params"},
                  "params": [self.shards[id(p)] for p in g["params"]]} for g in self.param_groups]
        self.optim = optimizer_class(inner, **defaults)
        for g, ig in zip(self.param_groups, self.optim.param_groups, strict=True):
            for k, v in ig.items():  # the optimizer's own defaults (betas, eps...), visible to the user
                if k != "params":
                    g.setdefault(k, v)
        self._used: set[int] = set()
        self._pending: list[tuple[int, dist.Work, Tensor, Tensor]] = []
        self._grad_bufs: dict[int, Tensor] = {}
        self._got: dict[int, set[int]] = {i: set() for i in range(len(self.buckets))}
        self._reduced = False
        self._done: set[int] = set()  # stage 2: buckets reduce-scattered at least once this step
        self._next = 0  # stage 2: the bucket to reduce next in this backward (buckets go in one order)
        self._need = [sum(p.requires_grad for p in b.params) for b in self.buckets]
        self._seen: set[int] = set()  # stage 2: parameters that got a gradient in this backward
        self._anywhere: set[int] | None = None  # stage 2: used on every rank, agreed at a backward's end
        self.hooks = [p.register_post_accumulate_grad_hook(self._hook(i, k))
                      for i, b in enumerate(self.buckets) for k, p in enumerate(b.params)
                      if stage == 2 and p.requires_grad]

    # -- gradients
    def _buffer(self, i: int) -> Tensor:
        if i not in self._grad_bufs:
            b = self.buckets[i]
            self._grad_bufs[i] = torch.zeros(b.n, b.width, dtype=b.dtype, device=b.params[0].device)
        return self._grad_bufs[i]

    def _hook(self, i: int, k: int):
        def hook(p: Tensor) -> None:
            buf = self._buffer(i)
            self.buckets[i].copy_in(buf, k, p.grad)
            p.grad = None
            if not self._seen:  # the first gradient of this backward: agree at its end
                torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self._used.add(id(p))
            self._seen.add(id(p))
            self._got[i].add(k)
            while self._next < len(self.buckets) and len(self._got[self._next]) == self._need[self._next]:
                self._reduce(self._next)  # in bucket order only: the same collectives on every rank
                self._next += 1
        return hook

    def _end_backward(self) -> None:
        """Stage 2, end of a backward: reduce the buckets not reduced yet, in order (those holding a
        parameter unused here too), then agree on which parameters got a gradient: every rank has issued
        the same collectives, so a rank that used other parameters is found here, not by a hang."""
        for i in range(self._next, len(self.buckets)):
            self._reduce(i)
        self._next = 0
        self._wait()
        params = [p for b in self.buckets for p in b.params]
        seen = [id(p) in self._seen for p in params]
        self._seen.clear()
        anywhere = self._agree(params, seen)
        now = {id(p) for p, a in zip(params, anywhere, strict=True) if a}
        self._anywhere = (self._anywhere or set()) | now

    def _reduce(self, i: int) -> None:
        """Start reduce-scattering bucket i's gradient buffer into this rank's slices. Stage 2 first
        finishes the one before: one bucket in flight, so that whole gradients do not pile up."""
        if self.stage == 2:
            self._wait()
        buf = self._buffer(i)
        del self._grad_bufs[i]
        b = self.buckets[i]
        out = torch.empty(b.width, dtype=b.dtype, device=b.params[0].device)
        work = reduce_scatter_single(out, buf.view(-1), group=self.group, async_op=True)
        self._pending.append((i, work, out, buf))
        self._got[i].clear()
        self._done.add(i)

    def _wait(self) -> None:
        for i, work, out, _ in self._pending:
            work.wait()
            out.div_(self.n)
            b = self.buckets[i]
            for k, p in enumerate(b.params):
                shard = self.shards[id(p)]
                piece = b.local(out, k)[:shard.numel()].view(shard.shape)
                shard.grad = piece if shard.grad is None else shard.grad.add_(piece)
        self._pending.clear()

    def reduce_gradients(self) -> None:
        """Average the gradients over the group into this rank's slices (`grad_shard`); `step()` calls it.
        Call it yourself to read or clip the averaged gradient before the step. A collective."""
        if self._reduced:
            return
        for i, b in enumerate(self.buckets):
            if self.stage == 1:  # pack this rank's whole gradients, then reduce-scatter them
                buf = self._buffer(i)
                for k, p in enumerate(b.params):
                    if p.grad is not None:
                        self._used.add(id(p))
                        b.copy_in(buf, k, p.grad)
                self._reduce(i)
            elif self._got[i] or i not in self._done:  # stage 2: a partial bucket, or one that got nothing
                self._reduce(i)
        self._wait()
        self._reduced = True
        self._drop_unused()

    def _agree(self, params: list[Tensor], used: list[bool]) -> list[bool]:
        return agree_on_usage(used, [self.names[id(p)] for p in params], self.group,
                              device=params[0].device if params else None,  # NCCL: on the GPU
                              who=f"ShardedOptimizer (ZeRO stage {self.stage})")

    def _drop_unused(self) -> None:
        """Which parameters had a gradient on some rank (stage 2: agreed at each backward's end; else one
        all-reduce now, an error if the ranks differ). torch.optim skips a parameter whose .grad is None;
        the slices of one that no rank computed get None too."""
        params = [p for b in self.buckets for p in b.params]
        if self._anywhere is not None:
            anywhere = [id(p) in self._anywhere for p in params]
        else:
            anywhere = self._agree(params, [id(p) in self._used for p in params])
        for flag, p in zip(anywhere, params, strict=True):
            if not flag:
                self.shards[id(p)].grad = None

    def grad_shard(self, p: Tensor) -> Tensor | None:
        """This rank's slice of the averaged gradient of parameter `p` (after `reduce_gradients`)."""
        return self.shards[id(p)].grad

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Clip the averaged gradient by its global norm, as `torch.nn.utils.clip_grad_norm_` does on one
        process (reduces the gradients first); returns the norm before clipping. A collective."""
        self.reduce_gradients()
        grads = [s.grad for s in self.shards.values() if s.grad is not None]
        return clip_sharded_grads_(grads, max_norm, norm_type, self.group)

    # -- the step
    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        """Average the gradients, run the optimizer on this rank's slices, all-gather the parameters."""
        if closure is not None:
            raise ValueError("closure: ShardedOptimizer.step takes no closure (LBFGS-style re-evaluation is "
                             "not sharded); compute the loss and call backward() before step()")
        self.reduce_gradients()
        for g, ig in zip(self.param_groups, self.optim.param_groups, strict=True):
            for k, v in g.items():  # a scheduler may have changed lr: the slices follow the user's groups
                if k != "params":
                    ig[k] = v
        self.optim.step()
        for b in self.buckets:
            mine = torch.zeros(b.width, dtype=b.dtype, device=b.params[0].device)
            for k, p in enumerate(b.params):
                shard = self.shards[id(p)]
                b.local(mine, k)[:shard.numel()].copy_(shard.reshape(-1))
            full = torch.empty(b.n, b.width, dtype=b.dtype, device=mine.device)
            all_gather_single(full.view(-1), mine, group=self.group)
            for k, p in enumerate(b.params):
                b.copy_out(full, k, p.detach())
        self._reduced = False
        self._used.clear()
        self._done.clear()
        self._anywhere = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: every `p.grad` and every slice's."""
        super().zero_grad(set_to_none=True)
        for s in self.shards.values():
            s.grad = None
        self._used.clear()
        self._done.clear()
        self._anywhere = None
        self._reduced = False

    # -- state dicts
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The whole optimizer state in `torch.optim`'s format, on every rank (a collective): what the same
        optimizer would hold on one process. It loads into a `ShardedOptimizer` on any number of ranks."""
        return full_state(self)

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's slices of the state, with what `state_dict.merge_sharded` needs to put the ranks'
        pieces together again (no communication: each rank saves its own file)."""
        return sharded_state(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load a whole state (from `state_dict`, or from `torch.optim` on one process): each rank keeps
        its own slices of it."""
        load_full_state(self, state_dict)

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for h in self.hooks:
            h.remove()
