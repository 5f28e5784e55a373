"""Collective matmul: the sequence-parallel all-gather and reduce-scatter hidden behind the matmuls they
feed (Wang et al. 2023, "Overlap communication with dependent computation via decomposition in large
deep learning models", ASPLOS; the idea behind PyTorch's async tensor parallelism).

Under sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2; `comm.all_gather_seq`,
`comm.reduce_scatter_seq`) a column-parallel layer waits for a whole all-gather before its matmul starts,
and a row-parallel layer's reduce-scatter waits for its whole matmul. Both matmuls are independent along
the sequence, so each can be cut into p chunks of s/p tokens and run one chunk at a time, while the ring
moves the next chunk between neighbours (rank r sends to r+1 and receives from r-1, positions in the
group):

- `all_gather_matmul` (Wang et al.'s AllGather-Einsum): at step i rank r multiplies the shard it holds,
  the one of rank r - i, while that shard travels on to r + 1 and the shard of rank r - i - 1 arrives.
  p matmuls of s/p rows, p - 1 point-to-point steps, each hidden behind a matmul that does not need it.
- `matmul_reduce_scatter` (their Einsum-ReduceScatter): an accumulator per output chunk travels round the
  ring; at step i rank r computes its partial product for chunk r - i - 1 while the accumulator of that
  chunk arrives, adds the two and passes the sum on. After p - 1 steps rank r holds the full sum of
  chunk r: the reduce-scatter's result.

Each rank sends p - 1 messages of n/p bytes: (p-1)/p n, exactly the ring all-gather's or reduce-scatter's
bytes (`distlab.comm_log.ring_bytes`); a `comm_log` records them as `send` and `recv`, labelled with the
layer's name. The two are each other's transpose, so the backward of one is the other: the gradient of
an all-gather-matmul with respect to its input is a matmul-reduce-scatter, and that of a
matmul-reduce-scatter is an all-gather-matmul (`_AllGatherLinear`, `_LinearReduceScatter`).

`OverlappedColumnParallelLinear` and `OverlappedRowParallelLinear` are chapter 5's layers with these
operators in place of the blocking collectives; `overlap_collective_matmuls(model)` swaps them into a
sequence-parallel `ParallelMLP`, `ParallelSelfAttention` or `ParallelGPT`, keeping the same parameters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab import staged_p2p
from distlab.comm_log import where as labelled
from distlab.tensor_parallel.comm import Group, _check_splits, group_rank, group_size
from distlab.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear


def _shift(send: Tensor, recv: Tensor, group: Group, where: str) -> list[dist.Work]:
    """Start one ring step: send `send` to the right neighbour, receive into `recv` from the left one."""
    r, p = group_rank(group), group_size(group)
    with labelled(where):
        return [staged_p2p.isend(send, group=group, group_dst=(r + 1) % p),
                staged_p2p.irecv(recv, group=group, group_src=(r - 1) % p)]


def _wait(works: list[dist.Work]) -> None:
    """Block until a ring step has arrived: the time the compute waits on communication (a profiler
    records it under this name)."""
    with torch.profiler.record_function("collective_matmul.wait"):
        for w in works:
            w.wait()


def _check_dim(x: Tensor, dim: int, where: str) -> int:
    """`dim` as a non-negative index of a sequence dimension of x; a ValueError for the contraction
    dimension (x's last, which the matmul sums over: cutting it would sum partial products nobody adds)."""
    name = where or "collective matmul"
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{name}: dim={dim} is out of range for x of shape {tuple(x.shape)}; pass the "
                         "sequence dimension (dim=1 for a (batch, seq, hidden) activation)")
    if dim % x.dim() == x.dim() - 1:
        raise ValueError(f"{name}: dim={dim} is x's last dimension, the one the matmul contracts with rhs; "
                         "the ring splits a dimension the product keeps: pass the sequence dimension (dim=1 "
                         "for a (batch, seq, hidden) activation)")
    return dim % x.dim()


def _check_same_shape(x: Tensor, group: Group, where: str, what: str) -> None:
    """Every rank of the group holds an x of the same shape (the ring receives into a buffer shaped like
    the sender's tensor; a mismatch would abort the process inside the backend). One all-reduce of a few
    integers; the same ValueError on every rank."""
    dims = [x.dim(), *x.shape][:9]
    mine = torch.tensor(dims + [0] * (9 - len(dims)), dtype=torch.int64)
    both = torch.cat([mine, -mine])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    high, low = both[:9], -both[9:]
    if not (torch.equal(high, mine) and torch.equal(low, mine)):
        n = int(high[0])
        lo, hi = tuple(low[1:1 + n].tolist()), tuple(high[1:1 + n].tolist())
        raise ValueError(f"{where or 'collective matmul'}: the ranks' {what} differ in shape (per dimension "
                         f"from {lo} to {hi}); the ring moves equal shards: give every rank an equal slice "
                         "(pad the sequence to a multiple of the group size)")


def all_gather_matmul(x: Tensor, rhs: Tensor, group: Group = None, where: str = "",
                      dim: int = 1) -> tuple[Tensor, Tensor]:
    """(all_gather(x, dim) @ rhs, all_gather(x, dim)) with the gather decomposed into p - 1 ring steps,
    each overlapped with the matmul of the shard already here (Wang et al. 2023, AllGather-Einsum).

    x: this rank's shard of the sequence (dim `dim`); rhs: (k, n). Returns the product, the shards in
    group-rank order along `dim`, and the gathered input (a weight gradient needs it)."""
    p = group_size(group)
    dim = _check_dim(x, dim, where)
    cur = x.contiguous()
    if p == 1 or not dist.is_initialized():
        return torch.matmul(cur, rhs), cur
    _check_same_shape(cur, group, where, "shards")
    r = group_rank(group)
    outs: list[Tensor] = [cur] * p
    shards: list[Tensor] = [cur] * p
    src = r
    for step in range(p):
        last = step == p - 1
        if not last:
            incoming = torch.empty_like(cur)
            works = _shift(cur, incoming, group, where)  # the shard moves on ...
        shards[src] = cur
        outs[src] = torch.matmul(cur, rhs)  # ... while the matmul that does not need the next one runs
        if not last:
            _wait(works)
            cur, src = incoming, (src - 1) % p
    return torch.cat(outs, dim=dim), torch.cat(shards, dim=dim)


def matmul_reduce_scatter(x: Tensor, rhs: Tensor, group: Group = None, where: str = "",
                          dim: int = 1) -> Tensor:
    """reduce_scatter(x @ rhs, dim): this rank's 1/p slice of `dim` of the sum over the group, with the
    reduce-scatter decomposed into p - 1 ring steps, each overlapped with the partial matmul of the
    next chunk (Wang et al. 2023, Einsum-ReduceScatter). x: the whole sequence (its length along `dim`
    divisible by p), holding this rank's partial-sum inputs; rhs: (k, n)."""
    p = group_size(group)
    dim = _check_dim(x, dim, where)
    _check_splits(x, dim, p, where)
    if p == 1 or not dist.is_initialized():
        return torch.matmul(x, rhs)
    _check_same_shape(x, group, where, "inputs")
    r = group_rank(group)
    chunks = x.chunk(p, dim=dim)
    acc = torch.matmul(chunks[(r - 1) % p], rhs).contiguous()  # the chunk whose sum ends at rank r - 1
    for step in range(1, p):
        incoming = torch.empty_like(acc)
        works = _shift(acc, incoming, group, where)  # the running sum moves on ...
        mine = torch.matmul(chunks[(r - step - 1) % p], rhs)  # ... while this rank's share of the next runs
        _wait(works)
        acc = incoming + mine
    return acc  # chunk r, summed over every rank


class _AllGatherLinear(torch.autograd.Function):
    """y = all_gather(x) W^T + b forward; backward: dx = reduce_scatter(dy W) as a matmul-reduce-scatter,
    dW = dy^T all_gather(x) from the gathered input saved in forward, db = the sum of dy."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, group: Group,  # type: ignore[override]
                where: str, dim: int) -> Tensor:
        y, gathered = all_gather_matmul(x, weight.t(), group, where, dim)
        ctx.save_for_backward(gathered, weight)
        ctx.group, ctx.where, ctx.dim, ctx.has_bias = group, where, dim, bias is not None
        return y if bias is None else y + bias

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        gathered, weight = ctx.saved_tensors
        dx = matmul_reduce_scatter(dy, weight, ctx.group, ctx.where, ctx.dim)
        flat_dy = dy.reshape(-1, dy.shape[-1])
        dw = flat_dy.t() @ gathered.reshape(-1, gathered.shape[-1])
        db = flat_dy.sum(0) if ctx.has_bias else None
        return dx, dw, db, None, None, None


class _LinearReduceScatter(torch.autograd.Function):
    """z = reduce_scatter(x W^T) forward; backward: (dx, all_gather(dz)) = all_gather_matmul(dz, W) and
    dW = all_gather(dz)^T x."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, group: Group, where: str,  # type: ignore[override]
                dim: int) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.where, ctx.dim = group, where, dim
        return matmul_reduce_scatter(x, weight.t(), group, where, dim)

    @staticmethod
    def backward(ctx, dz: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        dx, gathered = all_gather_matmul(dz, weight, ctx.group, ctx.where, ctx.dim)
        dw = gathered.reshape(-1, gathered.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return dx, dw, None, None, None


def all_gather_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, group: Group = None,
                      where: str = "", dim: int = 1) -> Tensor:
    """`F.linear(all_gather_seq(x), weight, bias)` as a collective matmul, forward and backward."""
    return _AllGatherLinear.apply(x, weight, bias, group, where, dim)


def linear_reduce_scatter(x: Tensor, weight: Tensor, group: Group = None, where: str = "",
                          dim: int = 1) -> Tensor:
    """`reduce_scatter_seq(F.linear(x, weight))` as a collective matmul, forward and backward."""
    return _LinearReduceScatter.apply(x, weight, group, where, dim)


def _require_sequence_parallel(sequence_parallel: bool, name: str) -> None:
    if not sequence_parallel:
        raise ValueError(f"{name}: sequence_parallel=False, but a collective matmul decomposes the "
                         "sequence-parallel all-gather and reduce-scatter (plain tensor parallelism's "
                         "all-reduce has no sequence to split); pass sequence_parallel=True")


class OverlappedColumnParallelLinear(ColumnParallelLinear):
    """`ColumnParallelLinear` under sequence parallelism, its all-gather overlapped with its matmul."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        _require_sequence_parallel(self.sequence_parallel, self.name)

    def forward(self, x: Tensor) -> Tensor:
        return all_gather_linear(x, self.weight, self.bias, self.group, self.name)


class OverlappedRowParallelLinear(RowParallelLinear):
    """`RowParallelLinear` under sequence parallelism, its reduce-scatter overlapped with its matmul."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        _require_sequence_parallel(self.sequence_parallel, self.name)

    def forward(self, x_parallel: Tensor) -> Tensor:
        y = linear_reduce_scatter(x_parallel, self.weight, self.group, self.name)
        return y if self.bias is None else y + self.bias


_TWINS = {ColumnParallelLinear: OverlappedColumnParallelLinear,
          RowParallelLinear: OverlappedRowParallelLinear}


def _twin(layer: nn.Module) -> nn.Module:
    """The overlapped twin of a chapter 5 layer, holding the very same parameters (an optimizer that
    holds them keeps working)."""
    twin = _TWINS[type(layer)].__new__(_TWINS[type(layer)])
    nn.Module.__init__(twin)
    twin.placements = layer.placements
    twin.group, twin.name, twin.sequence_parallel = layer.group, layer.name, layer.sequence_parallel
    twin.weight, twin.bias = layer.weight, layer.bias
    return twin


def overlap_collective_matmuls(model: nn.Module) -> nn.Module:
    """Replace, in place, every sequence-parallel `ColumnParallelLinear` and `RowParallelLinear` of
    `model` by its overlapped twin (same parameters, same placements, same names in the comm log), and
    return `model`. The embedding's reduce-scatter and the output layer's all-gather stay as they are."""
    swapped = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) in _TWINS and child.sequence_parallel:
                setattr(parent, child_name, _twin(child))
                swapped += 1
    if not swapped:
        raise ValueError(f"{type(model).__name__} has no sequence-parallel ColumnParallelLinear or "
                         "RowParallelLinear to overlap; build it with sequence_parallel=True")
    return model
