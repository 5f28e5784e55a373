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

Every operator takes a `TPGroup`: the process group, this rank's place in it, and an optional
`CommRecorder` that logs each collective that actually runs (name, direction, element count, bytes).
Nothing is global: two models in one process can use two groups and two recorders.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class CommRecord:
    """One collective call: `op` ("all_reduce", "all_gather", "reduce_scatter"), `phase` ("forward" or
    "backward"), `where` (the layer that called it), `numel` elements of the *whole* tensor the
    collective is about (the reduced tensor, or the gathered result: the convention of chapter 1) and
    its size in bytes."""

    op: str
    phase: str
    where: str
    numel: int
    nbytes: int


@dataclass
class CommRecorder:
    """Collects a `CommRecord` for every collective run through a `TPGroup` that holds this recorder."""

    records: list[CommRecord] = field(default_factory=list)

    def log(self, op: str, phase: str, where: str, tensor: Tensor) -> None:
        self.records.append(CommRecord(op, phase, where, tensor.numel(),
                                       tensor.numel() * tensor.element_size()))

    def clear(self) -> None:
        self.records.clear()

    def total_bytes(self, phase: str | None = None, op: str | None = None) -> int:
        """Bytes of the whole tensors handed to collectives, optionally for one phase and/or op."""
        return sum(r.nbytes for r in self.records
                   if (phase is None or r.phase == phase) and (op is None or r.op == op))


@dataclass
class TPGroup:
    """The tensor-parallel group a layer belongs to: `group` (None = the default group), this rank's
    index `rank` in it, its `size`, and the `recorder` (or None)."""

    group: dist.ProcessGroup | None
    rank: int
    size: int
    recorder: CommRecorder | None = None

    @classmethod
    def world(cls, recorder: CommRecorder | None = None) -> TPGroup:
        """All ranks of the default process group form one tensor-parallel group."""
        return cls(None, dist.get_rank(), dist.get_world_size(), recorder)

    @classmethod
    def single(cls, recorder: CommRecorder | None = None) -> TPGroup:
        """A group of one process, without torch.distributed: every collective is the identity."""
        return cls(None, 0, 1, recorder)

    def _log(self, op: str, phase: str, where: str, tensor: Tensor) -> None:
        if self.recorder is not None:
            self.recorder.log(op, phase, where, tensor)

    def all_reduce(self, x: Tensor, phase: str, where: str) -> Tensor:
        """Sum `x` over the group (out of place)."""
        self._log("all_reduce", phase, where, x)
        if self.size == 1:
            return x
        x = x.contiguous().clone()
        dist.all_reduce(x, group=self.group)
        return x

    def all_reduce_max(self, x: Tensor, phase: str, where: str) -> Tensor:
        """Elementwise maximum of `x` over the group (out of place)."""
        self._log("all_reduce", phase, where, x)
        if self.size == 1:
            return x
        x = x.contiguous().clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=self.group)
        return x

    def all_gather(self, x: Tensor, dim: int, phase: str, where: str) -> Tensor:
        """Concatenate every rank's `x` along `dim`, in rank order."""
        if self.size == 1:
            self._log("all_gather", phase, where, x)
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        out = torch.cat(parts, dim=dim)
        self._log("all_gather", phase, where, out)
        return out

    def reduce_scatter(self, x: Tensor, dim: int, phase: str, where: str) -> Tensor:
        """Sum `x` over the group and keep this rank's 1/size slice of `dim`."""
        self._log("reduce_scatter", phase, where, x)
        if self.size == 1:
            return x
        parts = [c.contiguous() for c in x.chunk(self.size, dim=dim)]
        out = torch.empty_like(parts[self.rank])
        dist.reduce_scatter(out, parts, group=self.group)
        return out

    def split(self, x: Tensor, dim: int) -> Tensor:
        """This rank's 1/size slice of `dim` (no communication)."""
        return x.chunk(self.size, dim=dim)[self.rank].contiguous()


class _F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, tp: TPGroup, where: str) -> Tensor:  # type: ignore[override]
        ctx.tp, ctx.where = tp, where
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        return ctx.tp.all_reduce(grad, "backward", ctx.where), None, None


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, tp: TPGroup, where: str) -> Tensor:  # type: ignore[override]
        return tp.all_reduce(x, "forward", where)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        return grad, None, None


class _AllGatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, tp: TPGroup, where: str, dim: int) -> Tensor:  # type: ignore[override]
        ctx.tp, ctx.where, ctx.dim = tp, where, dim
        return tp.all_gather(x, dim, "forward", where)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        return ctx.tp.reduce_scatter(grad, ctx.dim, "backward", ctx.where), None, None, None


class _ReduceScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, tp: TPGroup, where: str, dim: int) -> Tensor:  # type: ignore[override]
        ctx.tp, ctx.where, ctx.dim = tp, where, dim
        return tp.reduce_scatter(x, dim, "forward", where)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        return ctx.tp.all_gather(grad, ctx.dim, "backward", ctx.where), None, None, None


class _GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, tp: TPGroup, where: str) -> Tensor:  # type: ignore[override]
        ctx.tp = tp
        return tp.all_gather(x, x.dim() - 1, "forward", where)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        return ctx.tp.split(grad, grad.dim() - 1), None, None


def f(x: Tensor, tp: TPGroup, where: str = "") -> Tensor:
    """Identity forward, all-reduce backward (Shoeybi et al. 2019, sec. 3, the operator `f`).

    Put it where a replicated input enters a column-parallel layer: each rank's gradient with respect
    to that input is only its own columns' share, and the sum over ranks is the true gradient.
    """
    return _F.apply(x, tp, where)


def g(x: Tensor, tp: TPGroup, where: str = "") -> Tensor:
    """All-reduce forward, identity backward (Shoeybi et al. 2019, sec. 3, the operator `g`).

    Put it after a row-parallel layer: the ranks hold partial sums of the output, and their sum is the
    output. The gradient of a sum with respect to each term is the gradient of the sum itself.
    """
    return _G.apply(x, tp, where)


def all_gather_seq(x: Tensor, tp: TPGroup, where: str = "", dim: int = 1) -> Tensor:
    """All-gather along the sequence dimension forward, reduce-scatter backward (Korthikanti et al.
    2022, sec. 4.2.2, their `g`): takes a sequence-sharded activation into a tensor-parallel region."""
    return _AllGatherSeq.apply(x, tp, where, dim)


def reduce_scatter_seq(x: Tensor, tp: TPGroup, where: str = "", dim: int = 1) -> Tensor:
    """Reduce-scatter along the sequence dimension forward, all-gather backward (Korthikanti et al.
    2022, sec. 4.2.2, their `g-bar`): sums the partial outputs of a row-parallel layer and leaves each
    rank its slice of the sequence."""
    return _ReduceScatterSeq.apply(x, tp, where, dim)


def gather_last_dim(x: Tensor, tp: TPGroup, where: str = "") -> Tensor:
    """All-gather the last dimension forward, keep this rank's slice of the gradient backward."""
    return _GatherLastDim.apply(x, tp, where)
