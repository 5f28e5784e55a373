"""Gradient clipping by the global norm when every rank holds only a shard of every gradient.

`torch.nn.utils.clip_grad_norm_` computes ||g|| over all the model's gradients and, if it exceeds
`max_norm`, scales every gradient by max_norm / (||g|| + 1e-6) (Pascanu et al. 2013 introduced clipping by
norm). With the gradients sharded over N ranks no rank can compute ||g|| alone, but the p-th power of a
p-norm is a sum over elements: each rank sums |g|^p over its shards, one all-reduce adds the N partial
sums, and every rank then scales its own shards by the same coefficient. The infinity norm takes a max
instead. The padding of the shards holds zeros and changes neither.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


def check_norm_type(norm_type: float) -> float:
    """`norm_type` as a float if it is a positive number or inf, else a ValueError."""
    value = float(norm_type)
    if not value > 0:
        raise ValueError(f"norm_type={norm_type!r} must be positive (2.0 for the Euclidean norm, or "
                         "float('inf') for the largest element)")
    return value


def sharded_grad_norm(grads: Sequence[Tensor], norm_type: float = 2.0,
                      group: dist.ProcessGroup | None = None) -> Tensor:
    """The `norm_type`-norm of the whole gradient, whose pieces on this rank are `grads` (fp32 scalar,
    the same on every rank of `group`; a collective)."""
    p = check_norm_type(norm_type)
    device = grads[0].device if grads else torch.device("cpu")
    if math.isinf(p):
        local = max((g.detach().abs().max().float() for g in grads if g.numel()), default=None)
        total = torch.zeros((), device=device) if local is None else local.reshape(())
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
        return total
    total = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads:
        total += g.detach().double().abs().pow(p).sum()
    dist.all_reduce(total, group=group)
    return total.pow(1.0 / p).float()


def clip_sharded_grads_(grads: Sequence[Tensor], max_norm: float, norm_type: float = 2.0,
                        group: dist.ProcessGroup | None = None) -> Tensor:
    """Scale the gradient shards `grads` in place so that the global norm is at most `max_norm`, as
    `torch.nn.utils.clip_grad_norm_` does on one process; returns the norm before clipping."""
    if not (max_norm >= 0 and math.isfinite(max_norm)):
        raise ValueError(f"max_norm={max_norm!r} must be a finite number >= 0, e.g. max_norm=1.0")
    total = sharded_grad_norm(grads, norm_type, group)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return total
