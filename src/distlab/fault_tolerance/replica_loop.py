"""The methods of section 3 run two ways: on real ranks (`on_ranks`) and as a loop in one process
(`simulate`), with the same data, the same seed and the same inner optimizer.

A `Recipe` names the method and its settings: "dp" (data parallelism: the gradients averaged every step,
chapter 2's `all_reduce_bucket`), "local_sgd", "diloco", "streaming" (section 3's classes) or "powersgd"
(chapter 7's PowerSGD as a DDP communication hook; ranks only). At step s every replica r takes its shard
`sharding.shard(B, r, R)` of the global batch `task.batch(s, B, seed)` (`Task.shard_backward`).

`simulate` is the reference the ranks are compared with: R models in one process, written out without
process groups, without `OuterSync` and without `OuterNesterov` (the outer step is spelled out again), so
that a mistake in either shows up as a difference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import comm_log
from distlab.data_parallel.buckets import all_reduce_bucket
from distlab.fault_tolerance.diloco import DiLoCo
from distlab.fault_tolerance.local_sgd import LocalSGD, check_outer_lr, check_sync_dtype, check_sync_every
from distlab.fault_tolerance.powersgd_run import powersgd_ddp
from distlab.fault_tolerance.streaming import StreamingDiLoCo, layer_fragments, sync_offsets
from distlab.reference import SGD, Optimizer, Task

METHODS = ("dp", "local_sgd", "diloco", "streaming", "powersgd")


@dataclass(frozen=True)
class Recipe:
    """A method and its settings. `inner` is "adamw" (torch.optim.AdamW, DiLoCo's inner optimizer) or
    "sgd" (plain SGD, `reference.SGD`); `fragments` is K for "streaming"; `sync_dtype` the precision
    the pseudo-gradients travel in (None: the parameters' own)."""

    method: str
    sync_every: int = 1
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    fragments: int = 1
    sync_dtype: torch.dtype | None = None
    inner: str = "adamw"
    inner_lr: float = 3e-3
    weight_decay: float = 0.0
    powersgd_rank: int = 2

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not one of {', '.join(METHODS)}; pick one of them")
        if self.inner not in ("adamw", "sgd"):
            raise ValueError(f"inner={self.inner!r}: use 'adamw' (DiLoCo's) or 'sgd'")
        check_sync_every(self.sync_every)
        check_outer_lr(self.outer_lr)
        check_sync_dtype(self.sync_dtype)
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"outer_momentum={self.outer_momentum!r} must be in [0, 1); DiLoCo uses 0.9")
        if isinstance(self.inner_lr, bool) or not isinstance(self.inner_lr, (int, float)) \
                or not 0 < self.inner_lr < math.inf:
            raise ValueError(f"inner_lr={self.inner_lr!r} must be a positive finite number, e.g. 3e-3")
        if self.method == "streaming":
            sync_offsets(self.sync_every, self.fragments)

    @property
    def label(self) -> str:
        extra = {"dp": "", "powersgd": f" r={self.powersgd_rank}", "local_sgd": f" H={self.sync_every}",
                 "diloco": f" H={self.sync_every}",
                 "streaming": f" H={self.sync_every} K={self.fragments}"}[self.method]
        wire = f" {str(self.sync_dtype).removeprefix('torch.')}" if self.sync_dtype else ""
        return f"{self.method}{extra}{wire}"


@dataclass
class ReplicaRun:
    """One replica's run: its loss on its shard at every step, its parameters at the end, the averaged
    pseudo-gradients of its last outer step (DiLoCo), and what it sent (ring count, `comm_log`)."""

    losses: list[float]
    params: dict[str, Tensor]
    pseudo_gradients: list[Tensor] = field(default_factory=list)
    sent_bytes: float = 0.0
    calls: int = 0


def inner_optimizer(recipe: Recipe, params: list[nn.Parameter]) -> Optimizer:
    """The replica's own optimizer, as the recipe names it."""
    if recipe.inner == "sgd":
        return SGD(params, recipe.inner_lr)
    return torch.optim.AdamW(params, lr=recipe.inner_lr, weight_decay=recipe.weight_decay)


class DataParallel:
    """The baseline: after every backward, one all-reduce of all gradients (chapter 2), then the step."""

    def __init__(self, model: nn.Module, inner: Optimizer, group: dist.ProcessGroup | None) -> None:
        self.params, self.inner, self.group = list(model.parameters()), inner, group

    def step(self) -> None:
        all_reduce_bucket(self.params, self.group)
        self.inner.step()


def make_trainer(recipe: Recipe, model: nn.Module, inner: Optimizer,
                 group: dist.ProcessGroup | None) -> DataParallel | LocalSGD | DiLoCo | StreamingDiLoCo:
    """The object whose `step()` replaces `inner.step()` for this recipe."""
    r = recipe
    if r.method == "dp":
        return DataParallel(model, inner, group)
    if r.method == "local_sgd":
        return LocalSGD(model, inner, r.sync_every, group=group)
    if r.method == "diloco":
        return DiLoCo(model, inner, r.sync_every, r.outer_lr, r.outer_momentum, group=group,
                      sync_dtype=r.sync_dtype)
    if r.method == "streaming":
        return StreamingDiLoCo(model, inner, r.sync_every, layer_fragments(model, r.fragments), r.outer_lr,
                               r.outer_momentum, group=group, sync_dtype=r.sync_dtype)
    raise ValueError(f"method={r.method!r} has no trainer here; 'powersgd' runs through _powersgd_on_ranks")


def train_shards(task: Task, steps: int, global_batch: int, seed: int, group: dist.ProcessGroup | None,
                 model: nn.Module, inner: Optimizer, step: Callable[[], None]) -> list[float]:
    """The data loop every replica runs on ranks: at step s, this rank's shard of `task.batch(s, B, seed)`,
    forward through `model` and backward (`Task.shard_backward`), then `step()` (the method's trainer,
    or `inner.step`); the losses on the shard."""
    p, rank, losses = dist.get_world_size(group), dist.get_rank(group), []
    for s in range(steps):
        x, y = task.batch(s, global_batch, seed)
        inner.zero_grad(set_to_none=True)
        loss = task.shard_backward(model, x, y, rank, p)
        step()
        losses.append(loss.item())
    return losses


def on_ranks(recipe: Recipe, task: Task, steps: int, global_batch: int, seed: int = 0,
             group: dist.ProcessGroup | None = None, dtype: torch.dtype = torch.float32) -> ReplicaRun:
    """Inside a rank of `group`: train this replica for `steps` inner steps and report its run."""
    model = task.build(seed).to(dtype)
    if recipe.method == "powersgd":
        return _powersgd_on_ranks(recipe, model, task, steps, global_batch, seed, group)
    inner = inner_optimizer(recipe, list(model.parameters()))
    trainer = make_trainer(recipe, model, inner, group)
    with comm_log() as log:
        losses = train_shards(task, steps, global_batch, seed, group, model, inner, trainer.step)
    return ReplicaRun(losses, {n: q.detach().clone() for n, q in model.named_parameters()},
                      list(getattr(trainer, "pseudo_gradients", [])), log.sent_bytes(), log.calls())


def _powersgd_on_ranks(recipe: Recipe, model: nn.Module, task: Task, steps: int, global_batch: int, seed: int,
                       group: dist.ProcessGroup | None) -> ReplicaRun:
    """Inside a rank: train `model` with DDP + PowerSGD (rank `recipe.powersgd_rank`) and the inner
    optimizer; what it sent is what the hook's all-reduces sent."""
    ddp = powersgd_ddp(model, recipe.powersgd_rank, seed, group)
    inner = inner_optimizer(recipe, list(model.parameters()))
    with comm_log() as log:
        losses = train_shards(task, steps, global_batch, seed, group, ddp, inner, inner.step)
    params = {n: q.detach().clone() for n, q in model.named_parameters()}
    return ReplicaRun(losses, params, [], log.sent_bytes(where="powersgd"), log.calls(where="powersgd"))


def simulate(recipe: Recipe, task: Task, replicas: int, steps: int, global_batch: int, seed: int = 0,
             dtype: torch.dtype = torch.float32) -> list[ReplicaRun]:
    """The same training with the R replicas as a loop in one process: the reference for `on_ranks`.
    Runs on one intra-op thread (restored after): the models are tiny, and on a busy two-core machine a
    second thread makes every small kernel wait for it (ten times slower, measured)."""
    if recipe.method == "powersgd":
        raise ValueError("method='powersgd' runs on ranks only (a DDP hook); simulate dp or DiLoCo instead")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _simulate(recipe, task, replicas, steps, global_batch, seed, dtype)
    finally:
        torch.set_num_threads(threads)


def _simulate(recipe: Recipe, task: Task, replicas: int, steps: int, global_batch: int, seed: int,
              dtype: torch.dtype) -> list[ReplicaRun]:
    """The reference, top to bottom: R models and their inner optimizers; the fragments and when each is
    synchronized; every step, each replica's backward on its shard, the inner steps (after averaging the
    gradients for dp), then the outer step of each fragment that is due."""
    models = [task.build(seed).to(dtype) for _ in range(replicas)]
    inners = [inner_optimizer(recipe, list(m.parameters())) for m in models]
    names = [n for n, _ in models[0].named_parameters()]
    fragments, offsets = _fragments(recipe, models[0], names)
    global_params = _global_copies(models[0], fragments)
    buffers: list[dict[str, Tensor]] = [{} for _ in fragments]
    losses: list[list[float]] = [[] for _ in range(replicas)]
    last: dict[str, Tensor] = {}
    for s in range(steps):
        _backward_on_shards(task, models, inners, s, global_batch, seed, losses)
        _inner_steps(recipe, models, inners)
        if recipe.method != "dp":
            last |= _outer_steps(recipe, s, offsets, models, global_params, buffers)
    return _runs(models, losses, names, last)


def _global_copies(model: nn.Module, fragments: list[list[str]]) -> list[dict[str, Tensor]]:
    """The global parameters of each fragment: copies of `model`'s, by name."""
    return [{n: q.detach().clone() for n, q in model.named_parameters() if n in f} for f in fragments]


def _inner_steps(recipe: Recipe, models: list[nn.Module], inners: list[Optimizer]) -> None:
    """Every replica's inner optimizer step, after averaging the gradients for dp."""
    if recipe.method == "dp":
        _average_gradients(models)
    for inner in inners:
        inner.step()


def _fragments(recipe: Recipe, model: nn.Module, names: list[str]) -> tuple[list[list[str]], list[int]]:
    """The parameter names of each fragment (Streaming DiLoCo's K; one fragment of all names otherwise)
    and the step offset at which each is synchronized."""
    k = recipe.fragments if recipe.method == "streaming" else 1
    fragments = layer_fragments(model, k) if k > 1 else [names]
    return fragments, sync_offsets(recipe.sync_every, k)


def _backward_on_shards(task: Task, models: list[nn.Module], inners: list[Optimizer], s: int,
                        global_batch: int, seed: int, losses: list[list[float]]) -> None:
    """Step s's forward and backward of every replica r on its shard of the global batch; appends each
    replica's loss to losses[r]."""
    x, y = task.batch(s, global_batch, seed)
    for r, (model, inner) in enumerate(zip(models, inners, strict=True)):
        inner.zero_grad(set_to_none=True)
        losses[r].append(task.shard_backward(model, x, y, r, len(models)).item())


def _outer_steps(recipe: Recipe, s: int, offsets: list[int], models: list[nn.Module],
                 global_params: list[dict[str, Tensor]],
                 buffers: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """After step s: the outer step of every fragment f that is due ((s + 1) = offset_f mod H); the
    averaged pseudo-gradients of those fragments."""
    synced: dict[str, Tensor] = {}
    for f, offset in enumerate(offsets):
        if (s + 1) % recipe.sync_every == offset % recipe.sync_every:
            synced |= _sync_fragment(recipe, models, global_params[f], buffers[f])
    return synced


def _runs(models: list[nn.Module], losses: list[list[float]], names: list[str],
          last: dict[str, Tensor]) -> list[ReplicaRun]:
    """Each replica's run: its losses, its final parameters and the last averaged pseudo-gradients."""
    runs = [ReplicaRun(losses[r], {n: q.detach().clone() for n, q in m.named_parameters()})
            for r, m in enumerate(models)]
    for run in runs:
        run.pseudo_gradients = [last[n] for n in names if n in last]
    return runs


def _average_gradients(models: list[nn.Module]) -> None:
    grads = [[q.grad for q in m.parameters()] for m in models]
    for i in range(len(grads[0])):
        mean = torch.stack([g[i] for g in grads]).mean(0)
        for g in grads:
            g[i].copy_(mean)


@torch.no_grad()
def _sync_fragment(recipe: Recipe, models: list[nn.Module], theta: dict[str, Tensor],
                   buffer: dict[str, Tensor]) -> dict[str, Tensor]:
    """Local SGD: the mean of the replicas. DiLoCo: theta - lr (Delta + mu b), b = mu b + Delta, with
    Delta the mean of theta - theta_r (each cast to the wire's dtype first). Loads the result."""
    named = [dict(m.named_parameters()) for m in models]
    mu, lr, deltas = recipe.outer_momentum, recipe.outer_lr, {}
    for n in theta:
        if recipe.method == "local_sgd":
            theta[n] = torch.stack([p[n] for p in named]).mean(0)
        else:
            wire = recipe.sync_dtype or theta[n].dtype
            delta = torch.stack([(theta[n] - p[n]).to(wire) for p in named]).sum(0).to(theta[n].dtype)
            deltas[n] = delta / len(models)
            buffer[n] = deltas[n].clone() if n not in buffer else mu * buffer[n] + deltas[n]
            theta[n] = theta[n] - lr * (deltas[n] + mu * buffer[n]) if mu else theta[n] - lr * deltas[n]
        for p in named:
            p[n].copy_(theta[n])
    return deltas
