"""ZeRO's gradient reduction for `ShardedOptimizer`: each bucket reduce-scattered during the backward.

In ZeRO stages 1 and 2 (Rajbhandari et al. 2020, sec. 5.1-5.2) each rank needs only its own slice of the
averaged gradient, so the gradients are reduce-scattered, not all-reduced. `GradientReducer` does that
the way DDP overlaps its all-reduce with the backward (Li et al. 2020): a hook on each parameter notes
its gradient, and each bucket (`buckets.Bucket`), once all its gradients are in, is sent asynchronously
while the backward goes on. The buckets go in one order on every rank, each as soon as it and all before
it are full, and the rest at the end of the backward, so every rank issues the same collectives whatever
it used. Stage 1 (P_os) sends every `p.grad` as it is and leaves it there (this rank's own, whole
gradient); stage 2 (P_os+g) packs each gradient into its bucket as it arrives and drops it (`p.grad` is
None, the rank keeps only its slice). Several backward passes before the step add up.

Who used which parameter needs no collective of its own: each gradient buffer carries one count per
parameter (`Bucket.grad_buffer`), summed by the same reduction. A parameter that got no gradient on any
rank gets `.grad = None` on its slice, so the optimizer skips it as on one process; one used on some
ranks only is an error on every rank (`uneven.agree_on_usage`), raised at the end of the backward.

On gloo the reduce-scatter is run as an all-reduce of the bucket, in place, and each rank reads its own
row: gloo's own reduce_scatter_tensor is a clone of the input, an all-reduce of the clone and a copy of
this rank's chunk out of it (ProcessGroupGloo.cpp), so this puts the same bytes on the wire and saves
two copies. On other backends (NCCL) it is a real reduce-scatter.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.dist_compat import reduce_scatter_single
from distlab.memory.zero.buckets import Bucket
from distlab.memory.zero.uneven import agree_on_usage
from distlab.memory.zero.validate import densify_grad


class GradientReducer:
    """The gradients of the parameters in `buckets`, averaged over `group` into this rank's slices
    `shards` (id(param) -> slice, whose `.grad` it sets), during the backward: ZeRO `stage` 1 or 2.
    `names` (id(param) -> name) go into the error messages. It hooks the parameters when built."""

    def __init__(self, buckets: list[Bucket], shards: dict[int, nn.Parameter], names: dict[int, str],
                 group: dist.ProcessGroup | None, stage: int) -> None:
        self.buckets, self.shards, self.names, self.group, self.stage = buckets, shards, names, group, stage
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
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
        self._token = (object(), stage)  # a plain token on the parameter (a model's copy copies only it)
        self._claim()
        self.hooks = self._register_hooks()

    def _claim(self) -> None:
        """Mark this reducer as the one that reduces each parameter's gradient (see `_owner_check`)."""
        for p in self._all:
            owners = getattr(p, "_distlab_zero_owners", ())
            shared = self.stage == 1 and all(s == 1 for _, s in owners)
            p._distlab_zero_owners = (*owners, self._token) if shared else (self._token,)  # type: ignore

    def _register_hooks(self) -> list:
        """A post-accumulate-grad hook on each parameter that needs a gradient; the handles."""
        return [p.register_post_accumulate_grad_hook(self._hook(i, k))
                for i, b in enumerate(self.buckets) for k, p in enumerate(b.params) if p.requires_grad]

    def _hook(self, i: int, k: int) -> Callable[[Tensor], None]:
        def hook(p: Tensor) -> None:
            if self._token not in getattr(p, "_distlab_zero_owners", ()):
                return  # a newer ShardedOptimizer over this parameter takes its gradients
            densify_grad(p)  # nn.Embedding(sparse=True): the same values, in dense rows
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
        not pile up. On gloo, an all-reduce in place (see the module docstring)."""
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
                densify_grad(p)  # a sparse gradient set by hand
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
            anywhere = self._agree(params)
        now = {id(p) for p, a in zip(params, anywhere, strict=True) if a}
        self._used = now if self.stage == 1 else self._used | now
        self._counts.clear()

    def _agree(self, params: list[nn.Parameter]) -> list[bool]:
        """Which of `params` some rank used, by one all-reduce; an error on every rank if only some did."""
        mine = [id(p) in self._seen or self._sent.get(id(p), (None,))[0] is not None for p in params]
        return agree_on_usage(mine, [self.names[id(p)] for p in params], self.group,
                              device=params[0].device if params else None,  # NCCL: on the GPU
                              who=f"ShardedOptimizer (ZeRO stage {self.stage})")

    def reduce_gradients(self) -> None:
        """Reduce what no backward did (gradients set by hand), wait, and leave `.grad = None` on the
        slices of parameters that no rank used since the last step. Once per step: later calls return."""
        if self._reduced:
            return
        self._owner_check()
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

    def _owner_check(self) -> None:
        """A parameter has one gradient, and stage 2 takes it (`p.grad` is None once its slice is packed),
        so where a stage-2 ShardedOptimizer is involved one reducer per parameter handles it: the newest
        (stage-1 ones, which leave `p.grad` alone, share it). An older ShardedOptimizer whose parameters
        were taken would step on gradients it never saw; refuse, naming the fix."""
        taken = [p for p in self._all if self._token not in getattr(p, "_distlab_zero_owners", ())]
        if taken:
            raise RuntimeError(
                f"ShardedOptimizer: a newer ShardedOptimizer was built over {self.names[id(taken[0])]} (and "
                f"{len(taken) - 1} more of this one's parameters) and now reduces their gradients; step that "
                "one. Where stage 2 is involved, one ShardedOptimizer per parameter: stage 2 frees the "
                "gradient once it has its slice; to switch optimizers, call remove() on the old one, then "
                "build the new one")

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

    def forget(self) -> None:
        """A new step begins: nothing reduced, used or sent since."""
        self._reduced = False
        self._used.clear()
        self._done.clear()
        self._sent.clear()

    def remove(self) -> None:
        """Take the hooks off the parameters (and give up their ownership)."""
        for h in self.hooks:
            h.remove()
        for p in self._all:
            owners = getattr(p, "_distlab_zero_owners", ())
            if self._token in owners:
                p._distlab_zero_owners = tuple(o for o in owners if o is not self._token)  # type: ignore
