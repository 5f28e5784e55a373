"""Ring reduce-scatter, all-gather and all-reduce, built from point-to-point messages.

The ring all-reduce is a reduce-scatter followed by an all-gather, each p - 1 steps around a ring of the
participating ranks (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations"). With the alpha-beta-gamma model (alpha: latency per message, beta: seconds per byte
sent, gamma: seconds per byte reduced) and n bytes per rank:

    reduce-scatter   (p - 1) alpha + (p - 1)/p n beta + (p - 1)/p n gamma
    all-gather       (p - 1) alpha + (p - 1)/p n beta          (n = bytes of the gathered output)
    all-reduce       2 (p - 1) alpha + 2 (p - 1)/p n beta + (p - 1)/p n gamma

The bandwidth term is optimal: every rank must send and receive at least 2 (p - 1)/p n bytes.

This module also holds the small helpers every algorithm in the package shares: checking `ranks`,
turning a `ReduceOp` into a torch function, flattening a tensor, and one deadlock-free exchange.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

# reduce(a, b, out) computes out = a op b elementwise; out may be a or b (in place).
Reduce = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# A ring step moves at most this many bytes per message: a chunk is sent as several segments, so that
# reducing one segment overlaps with receiving the next (the pipelining gloo's own ring uses too).
SEGMENT_BYTES = 1 << 20

REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"


# --------------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------------

def participants(ranks: Sequence[int] | None) -> tuple[list[int], int]:
    """Check `ranks` against the default group; return it as a list and this rank's position in it."""
    if not dist.is_initialized():
        raise RuntimeError("no process group is initialised: call the collectives inside a function "
                           "started by distlab.launch.run(fn, world_size)")
    world, me = dist.get_world_size(), dist.get_rank()
    if ranks is None:
        return list(range(world)), me
    try:
        group = [operator.index(r) for r in ranks]
    except TypeError:
        raise ValueError(f"ranks={ranks!r} must be a sequence of integer global ranks, e.g. [0, 1, 2], "
                         "or None for all ranks") from None
    if not group:
        raise ValueError("ranks=[] is empty; list the global ranks that take part, or pass None for all")
    repeated = sorted({r for r in group if group.count(r) > 1})
    if repeated:
        raise ValueError(f"ranks={group} lists rank(s) {repeated} more than once; list each rank once")
    outside = [r for r in group if not 0 <= r < world]
    if outside:
        raise ValueError(f"ranks={group} contains {outside}, outside the world of {world} ranks "
                         f"(0 .. {world - 1}); use only existing ranks")
    if me not in group:
        raise ValueError(f"rank {me} called a collective over ranks={group}, which does not include it; "
                         f"call it only on the ranks listed, or add {me} to ranks")
    return group, group.index(me)


def position_of(group: list[int], rank: int, name: str) -> int:
    """Position of a root rank (`src` or `dst`, a global rank) in the group, with a clear error."""
    if rank not in group:
        raise ValueError(f"{name}={rank!r} is not one of the participating ranks={group}; "
                         f"choose {name} from ranks")
    return group.index(rank)


def reducer(op: ReduceOp) -> Reduce:
    """The torch function for `op`: reduce(a, b, out) sets out = a op b (out may alias a or b)."""
    table: list[tuple[object, Reduce]] = [
        (ReduceOp.SUM, lambda a, b, out: torch.add(a, b, out=out)),
        (ReduceOp.PRODUCT, lambda a, b, out: torch.mul(a, b, out=out)),
        (ReduceOp.MIN, lambda a, b, out: torch.minimum(a, b, out=out)),
        (ReduceOp.MAX, lambda a, b, out: torch.maximum(a, b, out=out)),
    ]
    for known, fn in table:
        try:
            if op == known:
                return fn
        except TypeError:
            break
    raise ValueError(f"op={op!r} is not supported; use ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN "
                     "or ReduceOp.MAX")


def flatten(tensor: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """A flat contiguous view of `tensor` (a contiguous copy when it is not contiguous; see write_back)."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    return tensor.reshape(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)


def write_back(tensor: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Finish an in-place collective: copy the result into `tensor` if `flat` was a copy of it."""
    if not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))
    return tensor


def exchange(send: torch.Tensor, send_to: int, recv: torch.Tensor, recv_from: int) -> None:
    """Send `send` and receive `recv` at the same time; empty tensors are skipped on both sides.

    Every rank posts its receive and its send *before* waiting on either. With blocking send/recv in
    the same order on every rank, a ring deadlocks as soon as messages exceed the transport's buffers
    (each rank waits in send for a neighbour that is itself waiting in send). batch_isend_irecv is
    avoided on purpose: on gloo it is only a loop over isend/irecv with extra coalescing checks.
    """
    works = []
    if recv.numel():
        works.append(dist.irecv(recv, recv_from))
    if send.numel():
        works.append(dist.isend(send, send_to))
    for work in works:
        work.wait()


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split range(numel) into `parts` contiguous (start, stop) chunks; the first numel % parts are one
    element longer than the rest (the layout of the ring's chunks and of reduce-scatter's output)."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts={parts!r} must be a positive integer (the number of chunks)")
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel={numel!r} must be a non-negative integer (the number of elements)")
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


# --------------------------------------------------------------------------------------------------
# The schedule: data that both the implementation and the figures read
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RingStep:
    """What one rank does in one ring step. Chunks and ranks are positions in the ring (0 .. p-1)."""

    phase: str  # "reduce-scatter" or "all-gather"
    send_chunk: int
    recv_chunk: int
    send_to: int
    recv_from: int


def ring_steps(p: int, pos: int) -> list[RingStep]:
    """The 2 (p - 1) steps of the ring all-reduce for the rank at ring position `pos`.

    Reduce-scatter step s: send chunk (pos - s - 1) mod p, receive chunk (pos - s - 2) mod p and reduce
    it, so that after p - 1 steps position i holds the full reduction of chunk i. All-gather step s: send
    chunk (pos - s) mod p (starting with the one this rank owns), receive chunk (pos - s - 1) mod p.
    """
    nxt, prv = (pos + 1) % p, (pos - 1) % p
    steps = [RingStep(REDUCE_SCATTER, (pos - s - 1) % p, (pos - s - 2) % p, nxt, prv) for s in range(p - 1)]
    steps += [RingStep(ALL_GATHER, (pos - s) % p, (pos - s - 1) % p, nxt, prv) for s in range(p - 1)]
    return steps


def ring_all_reduce_schedule(p: int) -> list[list[RingStep]]:
    """The ring all-reduce as data: schedule[step][rank] is a RingStep (ranks are ring positions).

    Steps 0 .. p-2 are the reduce-scatter, steps p-1 .. 2p-3 the all-gather; p = 1 has no steps.
    ring_reduce_scatter, ring_all_gather and ring_all_reduce follow exactly these steps.
    """
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p={p!r} must be a positive integer (the number of ranks in the ring)")
    per_rank = [ring_steps(p, r) for r in range(p)]
    return [[per_rank[r][s] for r in range(p)] for s in range(2 * (p - 1))]


# --------------------------------------------------------------------------------------------------
# The two phases, on a flat buffer whose chunks are given by `bounds`
# --------------------------------------------------------------------------------------------------

def _reduce_scatter_phase(flat: torch.Tensor, bounds: list[tuple[int, int]], group: list[int], pos: int,
                          reduce: Reduce, out: torch.Tensor | None) -> torch.Tensor:
    """Ring reduce-scatter over `flat`; returns the reduced chunk `pos`.

    out=None: accumulate into `flat` in place (its chunk `pos` ends fully reduced; the all-reduce uses
    this). Otherwise `flat` is left untouched: partial results travel in two rotating buffers and the
    last reduction writes into `out`.
    """
    p = len(group)
    largest = max(hi - lo for lo, hi in bounds)
    buffers = [flat.new_empty(largest), flat.new_empty(largest if out is not None else 0)]
    carry = flat[0:0]
    steps = [s for s in ring_steps(p, pos) if s.phase == REDUCE_SCATTER]
    for i, step in enumerate(steps):
        (slo, shi), (rlo, rhi) = bounds[step.send_chunk], bounds[step.recv_chunk]
        send = flat[slo:shi] if out is None or i == 0 else carry
        recv = buffers[i % 2 if out is not None else 0][: rhi - rlo]
        if out is None:
            target = flat[rlo:rhi]
        else:
            target = out if i == len(steps) - 1 else recv
        _exchange_and_reduce(send, group[step.send_to], recv, group[step.recv_from], flat[rlo:rhi], target,
                             reduce)
        carry = target
    lo, hi = bounds[pos]
    return flat[lo:hi] if out is None else out


def _exchange_and_reduce(send: torch.Tensor, send_to: int, recv: torch.Tensor, recv_from: int,
                         local: torch.Tensor, target: torch.Tensor, reduce: Reduce) -> None:
    """Send `send`, receive `recv`, and set target = local op recv, segment by segment as data lands.

    All receives and sends are posted first (deadlock-free, see `exchange`); then each segment is
    reduced as soon as it has arrived, while the later segments are still in flight.
    """
    seg = max(1, SEGMENT_BYTES // max(1, recv.element_size()))
    recvs = [(lo, dist.irecv(recv[lo:lo + seg], recv_from)) for lo in range(0, recv.numel(), seg)]
    sends = [dist.isend(send[lo:lo + seg], send_to) for lo in range(0, send.numel(), seg)]
    for lo, work in recvs:
        work.wait()
        reduce(local[lo:lo + seg], recv[lo:lo + seg], target[lo:lo + seg])
    for work in sends:
        work.wait()


def _all_gather_phase(flat: torch.Tensor, bounds: list[tuple[int, int]], group: list[int], pos: int) -> None:
    """Ring all-gather in place: chunk `pos` of `flat` is this rank's; afterwards every chunk is filled."""
    for step in ring_steps(len(group), pos):
        if step.phase == ALL_GATHER:
            (slo, shi), (rlo, rhi) = bounds[step.send_chunk], bounds[step.recv_chunk]
            exchange(flat[slo:shi], group[step.send_to], flat[rlo:rhi], group[step.recv_from])


# --------------------------------------------------------------------------------------------------
# The public collectives
# --------------------------------------------------------------------------------------------------

def ring_reduce_scatter(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
                        ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Ring reduce-scatter (Patarasuk & Yuan 2009): the reduction of chunk i of the flattened tensor
    lands on the rank at position i of `ranks`, with chunks as in chunk_bounds(tensor.numel(), p).

    Returns a new 1-D tensor (this rank's reduced chunk); `tensor` is not modified. Every rank must pass
    a tensor with the same number of elements and dtype.
    Cost: (p - 1) alpha + (p - 1)/p n beta + (p - 1)/p n gamma for n bytes per rank.
    """
    group, pos = participants(ranks)
    reduce = reducer(op)
    flat = flatten(tensor)
    bounds = chunk_bounds(flat.numel(), len(group))
    lo, hi = bounds[pos]
    out = flat.new_empty(hi - lo)
    if len(group) == 1:
        return out.copy_(flat)
    return _reduce_scatter_phase(flat, bounds, group, pos, reduce, out)


def ring_all_gather(tensor: torch.Tensor, ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Ring all-gather (Patarasuk & Yuan 2009): every rank's tensor, concatenated along dim 0 in `ranks`
    order (a 0-d tensor counts as shape (1,)). Every rank must pass the same shape and dtype.

    Each of the p - 1 steps forwards to the next rank the block received in the step before.
    Cost: (p - 1) alpha + (p - 1)/p n beta for n bytes of output.
    """
    group, pos = participants(ranks)
    flat = flatten(tensor)
    p, m = len(group), flat.numel()
    shape = tuple(tensor.shape) or (1,)
    out = flat.new_empty(p * m)
    out[pos * m:(pos + 1) * m].copy_(flat)
    if p > 1:
        _all_gather_phase(out, [(i * m, (i + 1) * m) for i in range(p)], group, pos)
    return out.view(p * shape[0], *shape[1:])


def ring_all_reduce(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
                    ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Ring all-reduce in place: a ring reduce-scatter, then a ring all-gather (Patarasuk & Yuan 2009).

    Follows ring_all_reduce_schedule(p) step by step. Each reduce-scatter step is pipelined in segments
    of SEGMENT_BYTES, so reducing one segment overlaps with receiving the next. Returns `tensor`.
    Cost: 2 (p - 1) alpha + 2 (p - 1)/p n beta + (p - 1)/p n gamma for n bytes per rank.
    """
    group, pos = participants(ranks)
    reduce = reducer(op)
    flat = flatten(tensor)
    if len(group) == 1 or flat.numel() == 0:
        return tensor
    bounds = chunk_bounds(flat.numel(), len(group))
    _reduce_scatter_phase(flat, bounds, group, pos, reduce, out=None)
    _all_gather_phase(flat, bounds, group, pos)
    return write_back(tensor, flat)
