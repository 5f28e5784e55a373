"""Local SGD: every replica trains alone for H steps, then the replicas average their parameters.

Each of the R replicas (data-parallel copies of the model, each with its own shard of every global batch)
takes H steps of its own optimizer without talking to the others; after every H-th step the replicas
replace their parameters by the average over the group (Stich 2019, "Local SGD Converges Fast and
Communicates Little", ICLR; the paper torchft's `LocalSGD` cites). With H = 1 and plain SGD this is
data parallelism: the mean of theta - lr g_r is theta - lr mean(g_r). The group sends the model once per H
steps instead of the gradients once per step: H times fewer bytes.

`check_sync_every`, `check_outer_lr` and `check_sync_dtype` are the boundary checks every method of this
chapter shares.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import where
from distlab.reference import Optimizer


def check_sync_every(sync_every: object) -> int:
    """H, the number of inner steps between two synchronisations: a positive integer."""
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every <= 0:
        raise ValueError(f"sync_every={sync_every!r} must be a positive integer number of inner steps H; "
                         "pass e.g. sync_every=8 (sync_every=1 synchronises after every step)")
    return sync_every


def check_outer_lr(outer_lr: object) -> float:
    """The outer learning rate: a positive finite number (DiLoCo uses 0.7; 1 without momentum is
    averaging). An infinite one would turn every parameter into inf or NaN at the first outer step."""
    if isinstance(outer_lr, bool) or not isinstance(outer_lr, (int, float)) or not 0 < outer_lr < math.inf:
        raise ValueError(f"outer_lr={outer_lr!r} must be a positive number (finite); pass e.g. outer_lr=0.7 "
                         "(DiLoCo's value) or outer_lr=1.0 with outer_momentum=0 to average the replicas")
    return float(outer_lr)


WIRE_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def check_sync_dtype(sync_dtype: object) -> torch.dtype | None:
    """The precision the averages travel in: None (the tensors' own) or a floating dtype of 16 bits or
    more. An integer dtype rounds every pseudo-gradient, most of them to 0 (training stops without an
    error), and torch.bool keeps only "non-zero": both are refused."""
    if sync_dtype is not None and sync_dtype not in WIRE_DTYPES:
        names = ", ".join(str(d) for d in WIRE_DTYPES)
        raise ValueError(f"sync_dtype={sync_dtype!r} must be None (send in the parameters' own dtype) or a "
                         f"floating dtype, one of {names}; pass e.g. sync_dtype=torch.bfloat16 to halve "
                         "the bytes")
    return sync_dtype  # type: ignore[return-value]


def average_(tensors: Iterable[Tensor], group: dist.ProcessGroup | None,
             dtype: torch.dtype | None = None) -> None:
    """Replace each tensor by its mean over `group`, all-reduced in `dtype` (None: the tensor's own).
    Sending in a lower precision (bfloat16) halves the bytes; the mean is cast back in place."""
    p = dist.get_world_size(group)
    for t in tensors:
        wire = t if dtype is None else t.to(dtype)
        dist.all_reduce(wire, group=group)
        t.copy_(wire.to(t.dtype) / p)


class LocalSGD:
    """Average the parameters of `model` over `group` after every `sync_every`-th inner step.

    Use it in place of `inner.step()`: `loss.backward(); local_sgd.step()`. `inner` is any optimizer
    (torch.optim.SGD or AdamW, `distlab.reference.SGD`); its state stays local to the replica.
    """

    def __init__(self, model: nn.Module, inner: Optimizer, sync_every: int,
                 group: dist.ProcessGroup | None = None) -> None:
        self.model, self.inner = model, inner
        self.sync_every = check_sync_every(sync_every)
        self.group = group
        self.local_step = 0
        self.syncs = 0

    def step(self) -> bool:
        """One inner step; returns True when this step ended with a synchronisation."""
        self.inner.step()
        self.local_step += 1
        if self.local_step % self.sync_every:
            return False
        self.sync()
        return True

    @torch.no_grad()
    def sync(self) -> None:
        with where("local_sgd/average"):
            average_([p.data for p in self.model.parameters()], self.group)
        self.syncs += 1
