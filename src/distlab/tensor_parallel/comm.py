"""The communication of tensor parallelism, as autograd functions (Shoeybi et al. 2019, sec. 3).

Megatron-LM names two conjugate operators:

- `f`: identity in the forward pass, all-reduce in the backward pass. It sits where a replicated
  activation enters a tensor-parallel region (before a column-parallel linear layer).
- `g`: all-reduce in the forward pass, identity in the backward pass. It sits where the partial sums
  of a row-parallel linear layer leave the region.

Sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2) replaces each all-reduce by its two halves,
splitting the activations *along the sequence* outside the tensor-parallel regions:

- `all_gather_seq` (their g): all-gather along the sequence forward, reduce-scatter backward;
- `reduce_scatter_seq` (their g-bar): reduce-scatter along the sequence forward, all-gather backward.

`gather_last_dim` (all-gather of the last dimension forward, keep own slice backward) is the tool for
looking at a sharded tensor whole, e.g. the logits in a test.

Every operator takes the tensor-parallel `group` (a `torch.distributed.ProcessGroup`; None = the whole
world, or a single process when torch.distributed is not initialised) and a `where` label, the name of
the layer that calls it. Nothing here counts bytes: every collective runs under
`distlab.comm_log.where(label)`, so an open `comm_log` records it (op, bytes, phase, label) and nothing
happens when none is open. When torch.distributed is initialised the collective runs even on a group of
one rank (where it changes nothing), so that a log sees the same calls for every p. Rank and size always
come from the group itself (`group_rank`, `group_size`), so they are positions in the group, never
global ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.comm_log import where as labelled
from distlab.mesh import group_rank, group_size

Group = dist.ProcessGroup | None


def _runs() -> bool:
    """Whether collectives run: inside a job with torch.distributed (any group size); not in a plain
    process, where every group is this process alone and each collective is the identity."""
    return dist.is_initialized()


def all_reduce(x: Tensor, group: Group, where: str = "",
               op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> Tensor:
    """Sum (or `op`) of `x` over the group, out of place."""
    if not _runs():
        return x
    x = x.contiguous().clone()
    with labelled(where):
        dist.all_reduce(x, op=op, group=group)
    return x


def _check_splits(x: Tensor, dim: int, size: int, where: str) -> None:
    """Every rank must get an equal slice of `dim`: raise (on every rank alike) when size does not divide."""
    if x.shape[dim] % size:
        raise ValueError(f"{where or 'tensor'}: dimension {dim % x.dim()} has length {x.shape[dim]}, "
                         f"which is not divisible by tensor-parallel size {size}; sequence parallelism gives "
                         f"every rank an equal slice: use a length that is a multiple of {size}")


def all_gather(x: Tensor, dim: int, group: Group, where: str = "") -> Tensor:
    """Concatenate every rank's `x` along `dim`, in group-rank order."""
    if not _runs():
        return x
    parts = [torch.empty_like(x) for _ in range(group_size(group))]
    with labelled(where):
        dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def reduce_scatter(x: Tensor, dim: int, group: Group, where: str = "") -> Tensor:
    """Sum `x` over the group and keep this rank's 1/size slice of `dim`."""
    size = group_size(group)
    _check_splits(x, dim, size, where)
    if not _runs():
        return x
    parts = [c.contiguous() for c in x.chunk(size, dim=dim)]
    out = torch.empty_like(parts[group_rank(group)])
    with labelled(where):
        dist.reduce_scatter(out, parts, group=group)
    return out


def split(x: Tensor, dim: int, group: Group) -> Tensor:
    """This rank's 1/size slice of `dim` (no communication)."""
    size = group_size(group)
    _check_splits(x, dim, size, "split")
    return x.chunk(size, dim=dim)[group_rank(group)].contiguous()


class _F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Group, where: str) -> Tensor:  # type: ignore[override]
        ctx.group, ctx.where = group, where
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        return all_reduce(grad, ctx.group, ctx.where), None, None


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Group, where: str) -> Tensor:  # type: ignore[override]
        return all_reduce(x, group, where)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        return grad, None, None


class _AllGatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Group, where: str, dim: int) -> Tensor:  # type: ignore[override]
        ctx.group, ctx.where, ctx.dim = group, where, dim
        return all_gather(x, dim, group, where)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        return reduce_scatter(grad, ctx.dim, ctx.group, ctx.where), None, None, None


class _ReduceScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Group, where: str, dim: int) -> Tensor:  # type: ignore[override]
        ctx.group, ctx.where, ctx.dim = group, where, dim
        return reduce_scatter(x, dim, group, where)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        return all_gather(grad, ctx.dim, ctx.group, ctx.where), None, None, None


class _GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Group, where: str) -> Tensor:  # type: ignore[override]
        ctx.group = group
        return all_gather(x, x.dim() - 1, group, where)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        return split(grad, grad.dim() - 1, ctx.group), None, None


def f(x: Tensor, group: Group = None, where: str = "") -> Tensor:
    """Identity forward, all-reduce backward (Shoeybi et al. 2019, sec. 3, the operator `f`).

    Put it where a replicated input enters a column-parallel layer: each rank's gradient with respect
    to that input is only its own columns' share, and the sum over ranks is the true gradient.
    """
    return _F.apply(x, group, where)


def g(x: Tensor, group: Group = None, where: str = "") -> Tensor:
    """All-reduce forward, identity backward (Shoeybi et al. 2019, sec. 3, the operator `g`).

    Put it after a row-parallel layer: the ranks hold partial sums of the output, and their sum is the
    output. The gradient of a sum with respect to each term is the gradient of the sum itself.
    """
    return _G.apply(x, group, where)


def all_gather_seq(x: Tensor, group: Group = None, where: str = "", dim: int = 1) -> Tensor:
    """All-gather along the sequence dimension forward, reduce-scatter backward (Korthikanti et al.
    2022, sec. 4.2.2, their `g`): takes a sequence-sharded activation into a tensor-parallel region."""
    return _AllGatherSeq.apply(x, group, where, dim)


def reduce_scatter_seq(x: Tensor, group: Group = None, where: str = "", dim: int = 1) -> Tensor:
    """Reduce-scatter along the sequence dimension forward, all-gather backward (Korthikanti et al.
    2022, sec. 4.2.2, their `g-bar`): sums the partial outputs of a row-parallel layer and leaves each
    rank its slice of the sequence."""
    return _ReduceScatterSeq.apply(x, group, where, dim)


def gather_last_dim(x: Tensor, group: Group = None, where: str = "") -> Tensor:
    """All-gather the last dimension forward, keep this rank's slice of the gradient backward."""
    return _GatherLastDim.apply(x, group, where)
