"""The peak of one accumulated step, measured: M micro-batches hold one micro-batch's activations at a
time, so the peak falls with the micro-batch while the gradient stays the large batch's (the technique is
`distlab.memory.techniques.accumulation`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distlab.memory.measure.accounting import LiveBytes, optimizer_tensors
from distlab.memory.techniques.accumulation import accumulate_gradients, split_batch


def accumulation_peak(
    model: nn.Module, idx: Tensor, targets: Tensor, micro_batch: int, optimizer: torch.optim.Optimizer
) -> int:
    """Peak live bytes of one accumulated step (zero_grad, M micro-steps, optimizer step), measured by
    `LiveBytes` with the parameters and the optimizer's state counted from the start."""
    optimizer.zero_grad(set_to_none=True)
    tracker = LiveBytes()
    tracker.adopt(model.parameters())
    tracker.adopt(optimizer_tensors(optimizer))
    with tracker:
        accumulate_gradients(model, split_batch(idx, targets, micro_batch))
        optimizer.step()
    return tracker.peak
