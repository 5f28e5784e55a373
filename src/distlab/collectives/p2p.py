"""The point-to-point layer every collective of chapter 1 is built on, and the checks they share.

Checking `ranks` (the participating global ranks, so that algorithms compose on sub-lists), turning a
`ReduceOp` into a torch function, flattening a tensor, and deadlock-free segmented transfers with
torch.distributed isend/irecv: exchange, send_all, recv_all, and exchange_reduce, which reduces each
segment as it lands while later ones are still in flight. The ring (`ring`, Patarasuk & Yuan 2009) and
the trees, recursive doubling and pairwise exchange (`algorithms`, Thakur, Rabenseifner & Gropp 2005)
are written with these and nothing else.

SEGMENT_BYTES, PIPELINE_DEPTH and MIN_SEGMENT_BYTES are read through this module at call time (the ring
reads them as `p2p.SEGMENT_BYTES`), so a test that shrinks them here shrinks them everywhere.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

# reduce(a, b, out) computes out = a op b elementwise; out may be a or b (in place).
Reduce = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# Messages are cut into segments of at most SEGMENT_BYTES, and PIPELINE_DEPTH receives are posted ahead:
# reducing one segment overlaps with receiving the next ones, and receive buffers stay a few segments
# long instead of a whole chunk. Larger segments mean fewer messages (each costs a rendezvous in gloo
# and a trip through Python); smaller ones mean more overlap. These values were measured best against
# gloo's dist.all_reduce on a 2-core machine (gloo's C++ ring uses 1 MiB segments, 2 in flight).
# Tests shrink them to exercise the pipeline on small tensors.
SEGMENT_BYTES = 4 << 20
PIPELINE_DEPTH = 4
MIN_SEGMENT_BYTES = 1 << 20  # a ring chunk smaller than two of these goes as one message per step


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


def _sum(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.add(a, b, out=out)


def _product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.mul(a, b, out=out)


def _min(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.minimum(a, b, out=out)


def _max(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.maximum(a, b, out=out)


def reducer(op: ReduceOp) -> Reduce:
    """The torch function for `op`: reduce(a, b, out) sets out = a op b (out may alias a or b)."""
    if isinstance(op, (ReduceOp, ReduceOp.RedOpType)):
        for known, fn in ((ReduceOp.SUM, _sum), (ReduceOp.PRODUCT, _product), (ReduceOp.MIN, _min),
                          (ReduceOp.MAX, _max)):
            if op == known:
                return fn
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


def segments(numel: int, element_size: int) -> list[tuple[int, int]]:
    """(start, stop) of each message a tensor of `numel` elements is sent as (SEGMENT_BYTES each)."""
    step = max(1, SEGMENT_BYTES // element_size)
    return [(lo, min(lo + step, numel)) for lo in range(0, numel, step)]


def exchange(send: torch.Tensor, send_to: int, recv: torch.Tensor, recv_from: int) -> None:
    """Send `send` to one rank while receiving `recv` from another (or the same); empty tensors skip.

    Every rank posts all its receives and sends *before* waiting on any. With blocking send/recv in
    the same order on every rank, a ring deadlocks as soon as messages exceed the transport's buffers
    (each rank waits in send for a neighbour that is itself waiting in send). Posting receives early
    also matters for speed: gloo moves a message only once the receiver has posted its receive.
    batch_isend_irecv is avoided on purpose: gloo has no batched point-to-point to map it to (it issues
    the same isend/irecv one by one inside a coalescing context designed for NCCL), so it gains nothing
    here, and explicit calls keep the order of messages visible.
    """
    works = [dist.irecv(recv[lo:hi], recv_from) for lo, hi in segments(recv.numel(), recv.element_size())]
    works += [dist.isend(send[lo:hi], send_to) for lo, hi in segments(send.numel(), send.element_size())]
    for work in works:
        work.wait()


def send_all(tensor: torch.Tensor, to: int) -> None:
    """Blocking send of `tensor` in segments (the matching receive is recv_all or exchange)."""
    exchange(tensor, to, tensor[:0], to)


def recv_all(tensor: torch.Tensor, source: int) -> None:
    """Blocking receive into `tensor` in segments (the matching send is send_all or exchange)."""
    exchange(tensor[:0], source, tensor, source)


def exchange_reduce(send: torch.Tensor, send_to: int, recv_from: int, local: torch.Tensor,
                    target: torch.Tensor, reduce: Reduce, pool: torch.Tensor, overlap: bool = False) -> None:
    """Send `send`; set target = local op (what arrives from `recv_from`), segment by segment.

    `pool` holds PIPELINE_DEPTH receive buffers of one segment each: the first receives are posted,
    then all sends, and each segment is reduced as soon as it lands while later ones are in flight.
    overlap=True when `target` is `send` itself (recursive doubling): a segment is overwritten only
    once its send has completed.
    """
    parts = segments(local.numel(), local.element_size())
    buffers = pool.view(PIPELINE_DEPTH, -1)
    recvs: deque[Any] = deque()

    def post(i: int) -> None:
        lo, hi = parts[i]
        recvs.append(dist.irecv(buffers[i % PIPELINE_DEPTH][: hi - lo], recv_from))

    for i in range(min(PIPELINE_DEPTH, len(parts))):
        post(i)
    sends = [dist.isend(send[lo:hi], send_to) for lo, hi in segments(send.numel(), send.element_size())]
    waited = 0  # sends waited for so far (a gloo work must be waited for exactly once)
    for i, (lo, hi) in enumerate(parts):
        recvs.popleft().wait()
        if overlap:
            sends[i].wait()
            waited = i + 1
        reduce(local[lo:hi], buffers[i % PIPELINE_DEPTH][: hi - lo], target[lo:hi])
        if i + PIPELINE_DEPTH < len(parts):
            post(i + PIPELINE_DEPTH)
    for work in sends[waited:]:
        work.wait()


def receive_pool(like: torch.Tensor, numel: int) -> torch.Tensor:
    """Receive buffers for exchange_reduce of up to `numel` elements: PIPELINE_DEPTH segments."""
    seg = min(numel, max(1, SEGMENT_BYTES // like.element_size()))
    return like.new_empty(PIPELINE_DEPTH * max(seg, 1))
