"""ZeRO stages 1 and 2 around any torch optimizer: `ShardedOptimizer(params, torch.optim.AdamW, ...)`.

This is what `torch.distributed.optim.ZeroRedundancyOptimizer` offers, built the way the ZeRO paper
describes (Rajbhandari et al. 2020, sec. 5.1-5.2). Group-rank i owns the i-th slice of every parameter
(`buckets.Bucket`); the given optimizer class runs on this rank's slices only, so its state (AdamW's two
moments, SGD's momentum) is 1/N of the whole. Per step:

- during the backward, as DDP does with its all-reduce (Li et al. 2020), a hook on each parameter notes
  its gradient, and each bucket, once all its gradients are in, is reduce-scattered (asynchronously, in
  one order on every rank) so that each rank gets its slices of the averaged gradient while the backward
  goes on. Stage 1 (P_os) sends every `p.grad` as it is and leaves it there (this rank's own, whole
  gradient); stage 2 (P_os+g) packs each gradient into its bucket as it arrives and drops it: `p.grad` is
  None, and the rank keeps only its slice (`grad_shard(p)`). Several backward passes before `step()`
  add up;
- then the inner optimizer steps on the slices, and one all-gather per bucket brings every replica the
  new parameters.

A parameter that got no gradient on any rank gets `.grad = None` on its slice, so the inner optimizer
skips it exactly as on one process. One that got a gradient on some ranks only is an error on every rank
(`uneven.agree_on_usage`), found at the end of the backward: the buckets go in one order, each as soon as
it and all before it are full, and the rest at the end of the backward, so every rank issues the same
collectives whatever it used. Who used what needs no collective of its own: it rides in the
reduce-scatter, one count per parameter (`buckets.Bucket.grad_buffer`).
Parameter groups (their own lr, weight_decay, ...) are kept: slice groups mirror them, and
`param_groups` is the user's, so learning-rate schedulers work. Optimizers that work element by element
(SGD, Adam, AdamW, RMSprop, Adagrad...) give the same result on slices (rows of dim 0, `buckets`) as on
whole tensors; one that reads a tensor's shape (Adafactor) does not, and is
refused.
"""

from __future__ import annotations

import inspect
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


def fast_path(optimizer_class: type, defaults: dict, groups: list[dict]) -> tuple[dict, dict]:
    """`foreach=True` for the optimizer on the slices, where its class takes it and the user left it
    unset: one call per operation over all the slices, not a Python loop over them (torch picks it by
    itself on a GPU, not on a CPU). Returns that, and the value the user's groups show (the class's)."""
    foreach = inspect.signature(optimizer_class).parameters.get("foreach")
    if foreach is None or "foreach" in defaults or any("foreach" in g for g in groups):
        return {}, {}
    return {"foreach": True}, {"foreach": foreach.default}


SHAPE_AWARE = ("Adafactor", "Muon", "LBFGS", "SparseAdam")  # these read a parameter's shape or history


class ShardedOptimizer(torch.optim.Optimizer):
    """`optimizer_class` (e.g. `torch.optim.AdamW`) with its state sharded over `group`: ZeRO `stage`
    1 or 2. `params` are parameters or parameter groups, as for any torch optimizer; `**defaults` are the
    optimizer's keyword arguments (lr, weight_decay, ...). Every rank of `group` builds it on the same
    model; the parameters of group-rank 0 are broadcast. `bucket_numel`: elements per collective
    (about 1M: a model of a few million parameters gets several buckets, so that the first ones are
    reduced while the backward goes on)."""

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer], *,
                 group: dist.ProcessGroup | None = None, stage: int = 1, bucket_numel: int = 1 << 20,
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
        self._fast, unset = fast_path(optimizer_class, defaults, self.param_groups)
        self.optim = optimizer_class(inner, **defaults, **self._fast)
        for g, ig in zip(self.param_groups, self.optim.param_groups, strict=True):
            for k, v in ig.items():  # the optimizer's own defaults (betas, eps...), visible to the user
                if k != "params":
                    g.setdefault(k, unset.get(k, v))
        self._all = [p for b in self.buckets for p in b.params]
        self._exact = 2 / max(torch.finfo(b.dtype).eps for b in self.buckets) if self.buckets else 0
        self._gloo = dist.get_backend(group) == dist.Backend.GLOO
        self._pending: list[tuple[int, dist.Work, Tensor | None, Tensor]] = []  # reduce-scatters in flight
        self._grad_bufs: dict[int, Tensor] = {}  # the gradient buckets (stage 2: while the hooks fill them)
        self._sent: dict[int, tuple[Tensor | None, int | None]] = {}  # stage 1: p.grad as it was sent
        self._counts: dict[int, float] = {}  # how many ranks used each parameter, from the last round
        self._used: set[int] = set()  # parameters with a gradient on every rank since the last step
        self._got: dict[int, set[int]] = {i: set() for i in range(len(self.buckets))}
        self._need = [sum(p.requires_grad for p in b.params) for b in self.buckets]
        self._next = 0  # the bucket to reduce next in this backward (buckets go in one order)
        self._seen: set[int] = set()  # parameters that got a gradient in this backward
        self._done: set[int] = set()  # buckets reduce-scattered since the last step
        self._reduced = False
        self.hooks = [p.register_post_accumulate_grad_hook(self._hook(i, k))
                      for i, b in enumerate(self.buckets) for k, p in enumerate(b.params) if p.requires_grad]

    # -- gradients: reduce-scattered from the hooks, during the backward, as DDP all-reduces
    def _hook(self, i: int, k: int):
        def hook(p: Tensor) -> None:
            if self.stage == 2:  # keep only the slice: pack the gradient now and let the whole one go
                b = self.buckets[i]
                if i not in self._grad_bufs:
                    self._grad_bufs[i] = b.grad_buffer()
                buf = self._grad_bufs[i]
                b.copy_in(buf, k, p.grad)
                b.mark_used(buf, k)
                p.grad = None
            if not self._seen:  # the first gradient of this backward: finish at its end
                torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self._seen.add(id(p))
            self._got[i].add(k)
            self._reduced = False
            while self._next < len(self.buckets) and len(self._got[self._next]) == self._need[self._next]:
                self._reduce(self._next)  # in bucket order only: the same collectives on every rank
                self._next += 1
        return hook

    def _end_backward(self) -> None:
        """End of a backward: reduce the buckets not reduced yet, in order (those holding a parameter
        unused here too), wait, and read who used what: every rank has issued the same collectives, so a
        rank that used other parameters is found here, not by a hang."""
        for i in range(self._next, len(self.buckets)):
            self._reduce(i)
        self._next = 0
        self._wait()
        self._settle()
        self._seen.clear()

    def _reduce(self, i: int) -> None:
        """Start reduce-scattering bucket i's gradients into this rank's slices. Stage 1 packs every
        `p.grad` as it is now (all of them, accumulated over the backward passes so far) into the
        bucket's buffer, kept from step to step as DDP keeps its buckets; stage 2 sends what its hooks
        packed, and first finishes the bucket before: one bucket in flight, so that whole gradients do
        not pile up. On gloo, whose reduce_scatter_tensor is an all-reduce of a copy of the input and
        then a copy of the chunk (ProcessGroupGloo.cpp), the all-reduce is called directly, in place:
        the same bytes on the wire, two copies fewer."""
        b = self.buckets[i]
        if self.stage == 2:
            self._wait()
            buf = self._grad_bufs.pop(i, None)
            buf = b.grad_buffer() if buf is None else buf
        else:
            buf = self._grad_bufs.get(i)
            if buf is None:
                buf = self._grad_bufs[i] = b.grad_buffer()
            for k, p in enumerate(b.params):
                if p.grad is None:
                    b.rows(buf, k).zero_()
                else:
                    b.copy_in(buf, k, p.grad)
                self._sent[id(p)] = (p.grad, None if p.grad is None else p.grad._version)
            buf[:, b.width:] = torch.tensor([p.grad is not None for p in b.params], dtype=b.dtype)
        if self._gloo:
            work, out = dist.all_reduce(buf, group=self.group, async_op=True), None
        else:
            out = torch.empty(buf.shape[1], dtype=b.dtype, device=buf.device)
            work = reduce_scatter_single(out, buf.view(-1), group=self.group, async_op=True)
        self._pending.append((i, work, out, buf))
        self._got[i].clear()
        self._done.add(i)

    def _wait(self) -> None:
        """Finish the reduce-scatters in flight: average, hand each slice its gradient (stage 1: the
        accumulated gradient, anew; stage 2: added to the backward passes before), note the counts."""
        for i, work, out, buf in self._pending:
            work.wait()
            b = self.buckets[i]
            out = buf[self.rank].clone() if out is None else out  # gloo: this rank's row of the sum
            grads = out[:b.width].div_(self.n)
            for k, (p, count) in enumerate(zip(b.params, out[b.width:].tolist(), strict=True)):
                shard = self.shards[id(p)]
                piece = b.local(grads, k)[:shard.numel()].view(shard.shape)
                add = self.stage == 2 and shard.grad is not None
                shard.grad = shard.grad.add_(piece) if add else piece
                self._counts[id(p)] = count
        self._pending.clear()

    def _settle(self) -> None:
        """After a round of reduce-scatters: which parameters got a gradient on every rank (the counts
        that came with the gradients), and an error on every rank if some ranks used a parameter and
        others not. Counts past the dtype's exact integers (bf16: 256 ranks) ask with one all-reduce."""
        params = self._all
        counts = [self._counts.get(id(p), 0) for p in params]
        if self.n <= self._exact and all(c in (0, self.n) for c in counts):
            anywhere = [c > 0 for c in counts]
        else:  # the exact answer, and the error naming the parameters and ranks
            mine = [id(p) in self._seen or self._sent.get(id(p), (None,))[0] is not None for p in params]
            anywhere = self._agree(params, mine)
        now = {id(p) for p, a in zip(params, anywhere, strict=True) if a}
        self._used = now if self.stage == 1 else self._used | now
        self._counts.clear()

    def reduce_gradients(self) -> None:
        """Average the gradients over the group into this rank's slices (`grad_shard`); `step()` calls it.
        The backward has reduced them already; this reduces what no backward did (gradients set by
        hand), and waits. Call it yourself to read or clip the averaged gradient before the step."""
        if self._reduced:
            return
        fresh = [i for i in range(len(self.buckets)) if i not in self._done or self._got[i]]
        for i in fresh:
            self._reduce(i)
        self._wait()
        if fresh:
            self._settle()
        if self.stage == 1:
            self._check_unchanged()
        for p in self._all:  # torch.optim skips a parameter whose .grad is None: so do its slices
            if id(p) not in self._used:
                self.shards[id(p)].grad = None
        self._reduced = True

    def _check_unchanged(self) -> None:
        """Stage 1: `p.grad` is this rank's own gradient, sent during the backward. Changing it afterwards
        would change nothing, silently; refuse instead, naming the fix."""
        for p in self._all:
            grad, version = self._sent.get(id(p), (None, None))
            if grad is not p.grad or (grad is not None and grad._version != version):
                raise RuntimeError(
                    f"ShardedOptimizer (ZeRO stage 1): the gradient of {self.names[id(p)]} changed after the "
                    "backward reduce-scattered it, so the change would be lost. Change the averaged "
                    "gradient instead: opt.clip_grad_norm_(max_norm), or opt.reduce_gradients() and then "
                    "opt.grad_shard(p)")

    def _agree(self, params: list[Tensor], used: list[bool]) -> list[bool]:
        return agree_on_usage(used, [self.names[id(p)] for p in params], self.group,
                              device=params[0].device if params else None,  # NCCL: on the GPU
                              who=f"ShardedOptimizer (ZeRO stage {self.stage})")

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
            ig.update(self._fast)
        self.optim.step()
        gathers = []  # every bucket's all-gather in flight at once; unpack each as it lands
        for b in self.buckets:
            mine = torch.empty(b.width, dtype=b.dtype, device=b.params[0].device)  # padding: never read
            for k, p in enumerate(b.params):
                shard = self.shards[id(p)]
                b.local(mine, k)[:shard.numel()].copy_(shard.reshape(-1))
            full = torch.empty(b.n, b.width, dtype=b.dtype, device=mine.device)
            gathers.append((b, full, all_gather_single(full.view(-1), mine, group=self.group, async_op=True)))
        for b, full, work in gathers:
            work.wait()
            for k, p in enumerate(b.params):  # this rank's own rows are the slices, updated in place
                b.copy_out(full, k, p.detach(), skip=self.rank)
        self._forget()

    def _forget(self) -> None:
        self._reduced = False
        self._used.clear()
        self._done.clear()
        self._sent.clear()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: every `p.grad` and every slice's."""
        super().zero_grad(set_to_none=True)
        for s in self.shards.values():
            s.grad = None
        self._forget()

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
