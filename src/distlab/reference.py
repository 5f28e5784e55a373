"""The task every chapter trains, and the single-process trainer every parallel run must reproduce.

- `Task`: a model to build from a seed, the examples to train it on, and its loss; `mlp_task` (regression
  with `models.MLP`) and `gpt_task` (next-character prediction with `models.GPT`). `task.batches(steps,
  global_batch, seed)` draws each step's global batch with `sharding.batch_indices`, the same draw every
  rank makes before it keeps its shard.
- `Task.shard_loss(model, x, y, rank, world)`: a rank's share of the global batch's mean loss, the one
  data-parallel step on a rank (`shard_backward` adds the backward); `group_mean(loss, group)` averages
  it over the ranks for the log. The group's average of the shares and of their gradients is the mean
  loss of the whole batch and its gradient, uneven shards and ignored targets included.
- `SGD`: stochastic gradient descent, with momentum, written out (torch.optim.SGD's update).
- `train_reference(model, batches, loss, optimizer)`: the one single-process loop. One process, the whole
  global batch at every step, any optimizer with `zero_grad()` and `step()`; it records the loss of every
  step, the gradients of the first, and the parameters after the last (and after every step on request),
  which is what a chapter's `parity.py` compares with `distlab.parity.compare`.

A parallel run (data, pipeline, tensor, 3D) must compute the same step as this loop, up to the rounding
of adding the same terms in another order (Li et al. 2020, "PyTorch Distributed", sec. 3.1: "the
gradients are averaged ... equivalent to local training"; `distlab.parity.TOLERANCE` says how close).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distlab import models, sharding

LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]
IGNORE_INDEX = -100  # the target F.cross_entropy leaves out of its mean by default


def count_rows(y: Tensor) -> int:
    """The terms a per-example mean loss averages over: one per example (row) of `y`."""
    return len(y)


def count_tokens(y: Tensor) -> int:
    """The terms a token-mean cross-entropy averages over: the targets that are not `IGNORE_INDEX`."""
    return int((y != IGNORE_INDEX).sum())


@dataclass
class Task:
    """A model to build and the data to train it on: `inputs[i]` and `targets[i]` are example i, and
    `loss(model, x, y)` is the mean loss over a batch, a mean of `terms(y)` terms (`count_rows`, or
    `count_tokens` for a language model). `build(seed)` seeds torch and builds the model."""

    name: str
    make_model: Callable[[], nn.Module]
    inputs: Tensor
    targets: Tensor
    loss: LossFn
    terms: Callable[[Tensor], int] = count_rows

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.targets) or len(self.inputs) == 0:
            raise ValueError(f"task {self.name!r} has {len(self.inputs)} inputs and {len(self.targets)} "
                             "targets; give it the same number of each, and at least one")

    def build(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return self.make_model()

    def __len__(self) -> int:
        return len(self.inputs)

    def batch(self, step: int, global_batch: int, seed: int) -> tuple[Tensor, Tensor]:
        """Step `step`'s global batch, drawn as every rank draws it (`sharding.batch_indices`)."""
        idx = sharding.batch_indices(len(self), global_batch, step, seed)
        return self.inputs[idx], self.targets[idx]

    def batches(self, steps: int, global_batch: int, seed: int) -> list[tuple[Tensor, Tensor]]:
        """The global batches of steps 0 .. steps - 1."""
        return [self.batch(step, global_batch, seed) for step in range(steps)]

    def shard_loss(self, model: nn.Module, x: Tensor, y: Tensor, rank: int, world: int) -> Tensor:
        """Rank `rank`'s share of the mean loss of the global batch (x, y), among `world` ranks: the mean
        loss on its rows `sharding.uneven_shard(len(x), rank, world)`, times world n_r / n, where n_r and n
        are the terms (`terms`) on its rows and in the whole batch. The average over the ranks of these
        shares, and of their gradients (what every data-parallel all-reduce computes), is the batch's mean
        loss and its gradient (Li et al. 2020, "PyTorch Distributed", sec. 3.1). With equal shares
        (n_r = n / world, the usual case) the factor is 1 and the share is the rows' mean loss itself."""
        mine = sharding.uneven_shard(len(x), rank, world)
        loss = self.loss(model, x[mine], y[mine])
        n_r, n = self.terms(y[mine]), self.terms(y)
        if n_r == 0:
            raise ValueError(f"rank {rank}'s rows {mine.start}..{mine.stop - 1} of the batch of {len(x)} "
                             "have no target that counts (all ignored), so its mean loss is 0/0; give "
                             "every rank a counted target or use fewer ranks")
        return loss if n_r * world == n else loss * (world * n_r / n)

    def shard_backward(self, model: nn.Module, x: Tensor, y: Tensor, rank: int, world: int) -> Tensor:
        """`shard_loss`, then its backward: the one data-parallel step on a rank before the gradients
        are averaged; returns the share (`group_mean` of it is the batch's mean loss)."""
        loss = self.shard_loss(model, x, y, rank, world)
        loss.backward()
        return loss


def mse_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The mean squared error of `model(x)` against `y` (regression)."""
    return F.mse_loss(model(x), y)


def lm_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """A language model's mean next-token cross-entropy (`models.GPT` returns (logits, loss))."""
    return model(x, y)[1]


def mlp_task(sizes: tuple[int, ...] = (16, 64, 64, 4), n: int = 480, seed: int = 0) -> Task:
    """Regression of `models.regression_data` with `models.MLP(sizes)` and the mean squared error."""
    X, y = models.regression_data(n, sizes[0], sizes[-1], seed=seed)
    return Task(f"MLP{list(sizes)}", lambda: models.MLP(sizes), X, y, mse_loss)


def gpt_task(n_layer: int = 2, n_embd: int = 32, block_size: int = 16, n: int = 240, seed: int = 0, *,
             n_head: int = 4, bias: bool = True, sentences: int = 400) -> Task:
    """Next-character prediction on `models.char_corpus(sentences)` with a small `models.GPT` (`n_head`
    heads, `bias` in its linears and layer norms): `n` windows of `block_size` tokens drawn once, with a
    fixed generator, so every rank sees the same examples."""
    text = models.char_corpus(sentences, seed=seed)
    tok = models.CharTokenizer(text)
    config = models.GPTConfig(vocab_size=tok.vocab_size, block_size=block_size, n_layer=n_layer,
                              n_head=n_head, n_embd=n_embd, bias=bias)
    x, y = models.get_batch(tok.encode(text), block_size, n, torch.Generator().manual_seed(seed))
    return Task(f"GPT(n_layer={n_layer}, n_embd={n_embd})", lambda: models.GPT(config), x, y, lm_loss,
                count_tokens)


def group_mean(value: Tensor, group: dist.ProcessGroup | None = None) -> float:
    """The mean of a scalar over the ranks of `group` (None: the whole world), one all-reduce of a copy:
    of `Task.shard_loss` shares, the global batch's mean loss (for the log; it leaves `value` alone)."""
    t = value.detach().clone().reshape(1)
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


class SGD:
    """Stochastic gradient descent with momentum, written out: v <- mu v + g, then w <- w - lr v (the
    update of torch.optim.SGD with dampening 0; v starts as the first gradient; mu = 0 is plain SGD,
    w <- w - lr g). Momentum makes a wrong step show up in later steps too. (Written here rather than
    taken from torch.optim, whose first use imports the compiler stack: seconds per rank on a small
    machine.)"""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, momentum: float = 0.0) -> None:
        self.params = list(params)
        self.lr, self.momentum = lr, momentum
        self.velocity: list[Tensor | None] = [None] * len(self.params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            if not self.momentum:
                p.sub_(self.lr * p.grad)
                continue
            v = self.velocity[i]
            if v is None:
                v = self.velocity[i] = p.grad.clone()
            else:
                v.mul_(self.momentum).add_(p.grad)
            p.add_(v, alpha=-self.lr)


class Optimizer(Protocol):
    def zero_grad(self, set_to_none: bool = ...) -> None: ...
    def step(self) -> object: ...


@dataclass
class ReferenceRun:
    """What the single process computed: the loss of every step (on its whole batch, before the step's
    update), the gradients of the first step, the parameters after the last step, and (with
    `keep_history`) the parameters before the first step and after every step, `history[t]` after t."""

    losses: list[float]
    first_grads: dict[str, Tensor]
    params: dict[str, Tensor]
    history: list[dict[str, Tensor]] = field(default_factory=list)


def _snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_reference(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], loss: LossFn,
                    optimizer: Optimizer, keep_history: bool = False) -> ReferenceRun:
    """Train `model` in one process, one optimizer step per (x, y) of `batches`, each the whole global
    batch: the loop every chapter's parallel run is compared with."""
    losses: list[float] = []
    first: dict[str, Tensor] = {}
    history = [_snapshot(model)] if keep_history else []
    for step, (x, y) in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        value = loss(model, x, y)
        value.backward()
        if step == 0:
            first = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        losses.append(value.item())
        if keep_history:
            history.append(_snapshot(model))
    if not losses:
        raise ValueError("batches is empty: train at least one step, or the reference is the initial "
                         "model and any comparison passes without testing anything")
    return ReferenceRun(losses, first, _snapshot(model), history)
