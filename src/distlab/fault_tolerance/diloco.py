"""DiLoCo: H inner AdamW steps per replica, then one outer Nesterov step on the averaged pseudo-gradient.

Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models" (arXiv
2311.08105), Algorithm 1. Every replica starts a round from the same global parameters theta, takes H steps
of its inner optimizer (AdamW) on its own data, and computes its pseudo-gradient

    Delta_r = theta - theta_r            (where it started minus where it ended)

The replicas average Delta over the group (one all-reduce of the model's size) and take one outer step
with SGD and Nesterov momentum (the paper's outer lr 0.7, momentum 0.9) on the global parameters, which
every replica then loads. Each replica's inner optimizer keeps its own state across rounds.

With H = 1, outer lr 1 and no outer momentum, theta - mean(theta - theta_r) = mean(theta_r): DiLoCo is then
local SGD with H = 1, which with a plain SGD inner optimizer is data parallelism.

`OuterSync` is one set of parameters synchronised this way; `DiLoCo` is one `OuterSync` over the whole
model, and `streaming.StreamingDiLoCo` one per fragment.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import where
from distlab.fault_tolerance.local_sgd import LocalSGD, average_, check_outer_lr, check_sync_dtype
from distlab.reference import Optimizer


class OuterNesterov:
    """SGD with Nesterov momentum on the global parameters, written out (torch.optim.SGD's update with
    nesterov=True, dampening 0): b <- mu b + Delta (b starts as the first Delta), then
    theta <- theta - lr (Delta + mu b); with mu = 0, theta <- theta - lr Delta (Sutskever et al. 2013)."""

    def __init__(self, lr: float, momentum: float = 0.9, nesterov: bool = True) -> None:
        self.lr = check_outer_lr(lr)
        if not 0 <= momentum < 1:
            raise ValueError(f"outer_momentum={momentum!r} must be in [0, 1); DiLoCo uses 0.9")
        self.momentum, self.nesterov = momentum, nesterov
        self.buffers: list[Tensor] | None = None

    @torch.no_grad()
    def step(self, params: Sequence[Tensor], deltas: Sequence[Tensor]) -> None:
        if not self.momentum:
            for p, d in zip(params, deltas, strict=True):
                p.sub_(self.lr * d)
            return
        if self.buffers is None:
            self.buffers = [d.clone() for d in deltas]
        else:
            for b, d in zip(self.buffers, deltas, strict=True):
                b.mul_(self.momentum).add_(d)
        for p, d, b in zip(params, deltas, self.buffers, strict=True):
            p.sub_(self.lr * (d + self.momentum * b) if self.nesterov else self.lr * b)


class OuterSync:
    """The outer loop of DiLoCo for one list of parameters: remembers the global values theta, and on
    `sync()` averages the pseudo-gradients theta - theta_r over `group` (in `sync_dtype` on the wire),
    steps the outer optimizer and loads the new theta into the parameters."""

    def __init__(self, params: Sequence[nn.Parameter], outer: OuterNesterov,
                 group: dist.ProcessGroup | None, sync_dtype: torch.dtype | None = None,
                 label: str = "diloco") -> None:
        self.params, self.outer, self.group = list(params), outer, group
        self.sync_dtype, self.label = check_sync_dtype(sync_dtype), label
        self.global_params = [p.detach().clone() for p in self.params]
        self.pseudo_gradients: list[Tensor] = []  # the averaged Delta of the last sync

    @torch.no_grad()
    def sync(self) -> None:
        deltas = [g - p.detach() for g, p in zip(self.global_params, self.params, strict=True)]
        with where(f"{self.label}/pseudo_gradient"):
            average_(deltas, self.group, self.sync_dtype)
        self.outer.step(self.global_params, deltas)
        for p, g in zip(self.params, self.global_params, strict=True):
            p.copy_(g)
        self.pseudo_gradients = deltas


class DiLoCo(LocalSGD):
    """DiLoCo over `group`: call `step()` in place of `inner.step()`; every `sync_every`-th call ends the
    round with an outer step (Douillard et al. 2023, Algorithm 1). Local SGD's loop (`LocalSGD.step`),
    with the parameter average replaced by the outer step on the averaged pseudo-gradient."""

    def __init__(self, model: nn.Module, inner: Optimizer, sync_every: int, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, nesterov: bool = True,
                 group: dist.ProcessGroup | None = None, sync_dtype: torch.dtype | None = None) -> None:
        super().__init__(model, inner, sync_every, group)
        self.outer = OuterSync(list(model.parameters()), OuterNesterov(outer_lr, outer_momentum, nesterov),
                               group, sync_dtype)

    def sync(self) -> None:
        """The outer step: average the pseudo-gradients over `group`, step the global copy, adopt it."""
        self.outer.sync()
        self.syncs += 1

    @property
    def pseudo_gradients(self) -> list[Tensor]:
        """The averaged pseudo-gradients of the last outer step, in `model.parameters()` order."""
        return self.outer.pseudo_gradients
