"""Gradient accumulation: M micro-batches, one optimizer step, the gradient of the whole batch.

The gradient of a mean over tokens is the token-weighted mean of the micro-batches' gradients, so
running backward on each micro-batch's loss times (its tokens / all tokens) and letting autograd add the
results into p.grad gives the large batch's gradient, while only one micro-batch's activations are alive
at a time (Goyal et al. 2017 use the same identity across ranks). Under data parallelism the averaging
over ranks should happen once, after the last micro-batch: chapter 2's strategies provide
`strategy.no_sync()` for the micro-steps before it, and `strategy.finish()` after it (Li et al. 2020,
sec. 3.2), so this file only decides when to call them. Its memory, measured, is
`distlab.memory.measure.accumulation_peak`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch
from torch import Tensor, nn


def accumulate_gradients(
    model: nn.Module, micro_batches: Sequence[tuple[Tensor, Tensor]], strategy: object | None = None
) -> Tensor:
    """Backward over every (idx, targets) micro-batch, weighted by its share of the tokens, into p.grad.

    `strategy` is a chapter-2 strategy (`distlab.data_parallel.make_strategy(name, model, ...)`) or None
    for one process: every micro-batch but the last runs inside `strategy.no_sync()`, and
    `strategy.finish()` averages over the ranks once at the end. Returns the whole batch's loss (detached).
    """
    if not micro_batches:
        raise ValueError("micro_batches is empty; pass at least one (idx, targets) pair")
    total = sum(y.numel() for _, y in micro_batches)
    loss_sum = torch.zeros(())
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with strategy.no_sync() if strategy is not None and not last else nullcontext():
            loss = model(x, y)[1] * (y.numel() / total)
            loss.backward()
        loss_sum += loss.detach()
    if strategy is not None:
        strategy.finish()
    return loss_sum


def split_batch(idx: Tensor, targets: Tensor, micro_batch: int) -> list[tuple[Tensor, Tensor]]:
    """Cut a batch into micro-batches of `micro_batch` sequences (the last may be smaller)."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch={micro_batch} must be at least 1 sequence")
    return [(idx[i : i + micro_batch], targets[i : i + micro_batch]) for i in range(0, len(idx), micro_batch)]
