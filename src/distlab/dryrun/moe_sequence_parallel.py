"""The shared expert of an MoE layer under sequence parallelism, as Megatron-Core runs it with tp > 1.

With tp > 1 and experts Megatron-Core requires sequence parallelism (its `TransformerConfig` refuses the one
without the other), so the MoE half of a layer on a tp rank starts from the rank's T / tp tokens: its
RMSNorm, its router and its share of the routed copies see only those (as `distlab.moe.folded_block` splits
them). The shared expert is a tensor-parallel MLP (Korthikanti et al. 2022, sec. 4.2.2): its column-parallel
gate and up projections all-gather the T / tp slices of the tp group into all T tokens (g) and keep, for
their backward, only the rank's slice, which they gather again there (Megatron-Core's
`LinearWithGradAccumulationAndAsyncCommunication` with `sequence_parallel`); its row-parallel down
projection reduce-scatters the T partial sums back to the rank's T / tp (g-bar). A rank thus computes
F_s / tp of the shared expert's width on all T tokens and saves T x F_s / tp of its hidden values, and no
gathered copy of its input.

On the fake world (`fake_world`) the all-gather and the reduce-scatter are the fake backend's: shapes right,
no value right.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab import dist_compat
from distlab.layout import Layout
from distlab.tensor_parallel.comm import reduce_scatter_seq

__all__ = ["SequenceParallelLinear", "sequence_parallel_swiglu", "tp_group_ranks"]


def tp_group_ranks(layout: Layout, rank: int) -> list[int]:
    """The tp group of global `rank`: tp consecutive ranks (tp innermost, Megatron-Core's order)."""
    tp = layout.size("tp")
    start = rank // tp * tp
    return list(range(start, start + tp))


def _gather(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    out = x.new_empty(x.shape[0] * dist.get_world_size(group), *x.shape[1:])
    dist_compat.all_gather_single(out, x.contiguous(), group=group)
    return out


def _reduce_scatter(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    out = x.new_empty(x.shape[0] // dist.get_world_size(group), *x.shape[1:])
    dist_compat.reduce_scatter_single(out, x.contiguous(), group=group)
    return out


class SequenceParallelLinear(torch.autograd.Function):
    """A column-parallel linear layer on a sequence-parallel input: all-gathers the tp group's slices,
    multiplies, and saves only the rank's slice (gathered again in backward) and the weight."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, group: dist.ProcessGroup) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.group = group
        return _gather(x, group) @ weight.t()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        whole = _gather(x, ctx.group)
        return _reduce_scatter(grad @ weight, ctx.group), grad.t() @ whole, None


def sequence_parallel_swiglu(x: Tensor, mlp: nn.Module, group: dist.ProcessGroup) -> Tensor:
    """`mlp` (a SwiGLU with gate, up and down, F / tp wide) on the rank's T / tp tokens `x`, as a
    tensor-parallel MLP under sequence parallelism (module docstring): T / tp output rows."""
    gate = SequenceParallelLinear.apply(x, mlp.gate.weight, group)
    up = SequenceParallelLinear.apply(x, mlp.up.weight, group)
    return reduce_scatter_seq(mlp.down(nn.functional.silu(gate) * up), group, dim=0)
