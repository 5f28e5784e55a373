"""Flat, padded, sharded buffers of parameters, and Adam on one shard of them.

ZeRO (Rajbhandari et al. 2020, sec. 5) partitions the model states into N equal parts, one per
data-parallel rank. To cut a model with tensors of many shapes into equal parts, lay a group of
parameters (a *unit*: one layer, or the whole model) end to end in one flat buffer, pad it with zeros to
a multiple of N elements, and give group-rank i the i-th of N equal slices. PyTorch's FSDP (Zhao et al.
2023) shards each of its units the same way. Padding is what makes uneven sizes work: a unit of 1000
parameters on N = 3 ranks becomes 1002 elements, three shards of 334, and the last shard ends with two
zeros that no parameter uses (their gradient is zero, so Adam leaves them zero).

`ShardAdam` is Adam (Kingma & Ba 2015) applied to one flat shard, written with the same tensor operations
in the same order as `torch.optim.Adam`'s single-tensor path, so that on the same gradients it produces
bitwise the same parameters: element-wise math does not care how the elements are grouped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


class FlatUnit:
    """The parameters `params` of one unit laid end to end: `numel` elements, padded to `padded_numel`
    (a multiple of `group_size`), cut into `group_size` shards of `shard_numel`."""

    def __init__(self, name: str, params: Sequence[nn.Parameter], group_size: int) -> None:
        self.name = name
        self.params = list(params)
        self.group_size = group_size
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // group_size)  # ceil: the last shard may end in padding
        self.padded_numel = self.shard_numel * group_size
        self.offsets = [0]
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())

    def shard_slice(self, rank: int) -> slice:
        """The elements of the flat buffer that group-rank `rank` owns."""
        return slice(rank * self.shard_numel, (rank + 1) * self.shard_numel)

    def flatten(self, tensors: Sequence[Tensor | None]) -> Tensor:
        """`tensors` (one per parameter, None = zeros) laid end to end and zero-padded."""
        dtype, device = self.params[0].dtype, self.params[0].device
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=device)
        for t, start, stop in zip(tensors, self.offsets[:-1], self.offsets[1:], strict=True):
            if t is not None:
                flat[start:stop].copy_(t.reshape(-1))
        return flat

    def bind(self, flat: Tensor) -> None:
        """Make every parameter a view into `flat`: writing `flat` writes the parameters (FSDP1's trick)."""
        for p, start, stop in zip(self.params, self.offsets[:-1], self.offsets[1:], strict=True):
            p.data = flat[start:stop].view(p.shape)

    def views(self, flat: Tensor) -> list[Tensor]:
        """One view of `flat` per parameter, shaped like it."""
        return [flat[a:b].view(p.shape)
                for p, a, b in zip(self.params, self.offsets[:-1], self.offsets[1:], strict=True)]


def free_storage(t: Tensor) -> None:
    """Release `t`'s memory but keep the tensor object (and every view of it): its storage shrinks to 0
    bytes. `alloc_storage` gives the memory back before the next use."""
    t.untyped_storage().resize_(0)


def alloc_storage(t: Tensor) -> None:
    """Re-allocate the storage of a tensor freed by `free_storage` (its contents are undefined)."""
    nbytes = t.numel() * t.element_size()
    if t.untyped_storage().nbytes() != nbytes:
        t.untyped_storage().resize_(nbytes)


@dataclass(frozen=True)
class AdamConfig:
    """Adam's hyper-parameters, as `torch.optim.Adam` names them (L2 weight decay, not AdamW's)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr={self.lr!r} must be a positive number, e.g. lr=1e-3")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas={self.betas!r} must both be in [0, 1), e.g. betas=(0.9, 0.999)")
        if not (self.eps >= 0 and math.isfinite(self.eps)):
            raise ValueError(f"eps={self.eps!r} must be a finite number >= 0 (it keeps Adam's division away "
                             "from zero), e.g. eps=1e-8")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise ValueError(f"weight_decay={self.weight_decay!r} must be a finite number >= 0, e.g. "
                             "weight_decay=0.0 (none) or 0.01")


class ShardAdam:
    """Adam's state (exp_avg m, exp_avg_sq v: 8 bytes per fp32 element) for one flat shard, and its step.

    The operations are those of `torch.optim.Adam` (single-tensor path, amsgrad off), in its order.
    The state is fp32 (`dtype`), or fp64 for a float64 model, whose parity checks need every digit; a
    bf16 or fp16 shard is updated from fp32 state. `segments[j]` is the (start, stop) of parameter j
    inside the shard (None where the parameter lies outside it): torch counts Adam's steps per parameter
    and skips a parameter that got no gradient, so the step does the same, segment by segment, when
    `active` says some parameter got none (or the counts differ); otherwise it updates the shard at once.
    """

    def __init__(self, numel: int, config: AdamConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32,
                 segments: Sequence[tuple[int, int] | None] | None = None) -> None:
        self.config = config
        self.exp_avg = torch.zeros(numel, device=device, dtype=dtype)
        self.exp_avg_sq = torch.zeros(numel, device=device, dtype=dtype)
        self.segments = list(segments) if segments is not None else [(0, numel)]
        self.steps = [0] * len(self.segments)

    @property
    def step_count(self) -> int:
        """Adam's step t (the largest over the parameters, which agree unless one was skipped)."""
        return max(self.steps, default=0)

    @step_count.setter
    def step_count(self, value: int) -> None:
        self.steps = [int(value)] * len(self.segments)

    def state_tensors(self) -> list[Tensor]:
        return [self.exp_avg, self.exp_avg_sq]

    def step(self, param: Tensor, grad: Tensor, active: Sequence[bool] | None = None) -> None:
        """Update the flat shard `param` in place from its averaged gradient `grad`; parameter j is
        updated only where `active[j]` (None: all are)."""
        on = [True] * len(self.segments) if active is None else list(active)
        if all(on) and len(set(self.steps)) <= 1:
            self.steps = [s + 1 for s in self.steps]
            self._update(param, grad, self.exp_avg, self.exp_avg_sq, self.step_count)
            return
        for j, seg in enumerate(self.segments):
            if on[j] and seg is not None:
                self.steps[j] += 1
                a, b = seg
                self._update(param[a:b], grad[a:b], self.exp_avg[a:b], self.exp_avg_sq[a:b], self.steps[j])

    def _update(self, param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, t: int) -> None:
        c = self.config
        beta1, beta2 = c.betas
        grad = grad.to(exp_avg.dtype)  # a bf16/fp16 gradient meets fp32 state
        if c.weight_decay != 0:
            grad = grad.add(param, alpha=c.weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = float(t)  # torch keeps the step as a float32 tensor and reads it back
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = c.lr / bias_correction1
        denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(c.eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


def shard_segments(layout: FlatUnit, rank: int) -> list[tuple[int, int] | None]:
    """Where each parameter of `layout` lies inside group-rank `rank`'s shard: (start, stop) offsets in
    the shard, or None for a parameter wholly outside it."""
    lo, hi = rank * layout.shard_numel, (rank + 1) * layout.shard_numel
    out: list[tuple[int, int] | None] = []
    for a, b in zip(layout.offsets[:-1], layout.offsets[1:], strict=True):
        a, b = max(a, lo), min(b, hi)
        out.append((a - lo, b - lo) if a < b else None)
    return out
