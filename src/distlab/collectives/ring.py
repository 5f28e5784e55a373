"""Ring reduce-scatter, all-gather and all-reduce, built from point-to-point messages.

The ring all-reduce is a reduce-scatter followed by an all-gather, each p - 1 steps around a ring of the
participating ranks (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations"). With the alpha-beta-gamma model (alpha: latency per message, beta: seconds per byte
sent, gamma: seconds per byte reduced) and n bytes per rank:

    reduce-scatter   (p - 1) alpha + (p - 1)/p n beta + (p - 1)/p n gamma
    all-gather       (p - 1) alpha + (p - 1)/p n beta          (n = bytes of the gathered output)
    all-reduce       2 (p - 1) alpha + 2 (p - 1)/p n beta + (p - 1)/p n gamma

The bandwidth term is optimal: every rank must send and receive at least 2 (p - 1)/p n bytes.

Each chunk travels in segments that stream around the ring (see _ring_pipeline), so that receiving,
reducing and forwarding overlap, as in gloo's own ring all-reduce.

The helpers the ring shares with every other algorithm (checking `ranks`, reducers, segmented
point-to-point transfers, and the segment sizes SEGMENT_BYTES, PIPELINE_DEPTH, MIN_SEGMENT_BYTES) live in
`p2p`; the ring reads those sizes as `p2p.SEGMENT_BYTES` etc. at call time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from distlab.collectives import p2p
from distlab.collectives.p2p import Reduce, flatten, participants, reducer, write_back

REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"


# --------------------------------------------------------------------------------------------------
# The chunks: how a vector is cut among the ring's ranks
# --------------------------------------------------------------------------------------------------

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
# Running ring steps as one pipeline of segments
# --------------------------------------------------------------------------------------------------

def _segmenting(bounds: list[tuple[int, int]], element_size: int) -> tuple[int, int]:
    """(segments per chunk, elements in the longest segment) for chunks `bounds`."""
    largest = bounds[0][1] - bounds[0][0]  # chunk_bounds puts the longest chunk first
    nbytes = largest * element_size
    per_chunk = max(-(-nbytes // p2p.SEGMENT_BYTES), 2 if nbytes >= 2 * p2p.MIN_SEGMENT_BYTES else 1)
    return per_chunk, -(-largest // per_chunk)


def _ring_pipeline(flat: torch.Tensor, bounds: list[tuple[int, int]], group: list[int],
                   steps: list[RingStep], reduce: Reduce | None = None,
                   partials: list[torch.Tensor] | None = None) -> None:
    """Run ring `steps` on `flat` (chunks given by `bounds`) as one stream of segments.

    Every chunk is cut into the same number S of segments; item i is segment i % S of step i // S.
    The segment sent in item i + S is the one received in item i, so it is sent as soon as item i has
    arrived (and been reduced): segments flow on around the ring without waiting for whole chunks,
    and receiving, reducing and sending overlap, as in gloo's own ring. Receives are posted
    PIPELINE_DEPTH items ahead, because gloo moves a message only once its receive is posted.
    Reduce-scatter steps receive into a small pool and reduce into `flat`, or, with `partials`, into
    partials[s] for step s (step s + 1 sends it on; all but the last hold S segment slots of the
    largest segment's length), leaving `flat` untouched. All-gather steps receive straight into `flat`.
    """
    per_chunk, seg_len = _segmenting(bounds, flat.element_size())
    cuts = [chunk_bounds(hi - lo, per_chunk) for lo, hi in bounds]  # segments, relative to the chunk
    items = len(steps) * per_chunk
    # Receive slots: PIPELINE_DEPTH, or fewer when the reduce-scatter has fewer items than that. Fresh
    # pages cost a page fault each on first touch, which at a few MB is a visible part of the time.
    ahead = p2p.PIPELINE_DEPTH
    scattered = sum(s.phase == REDUCE_SCATTER for s in steps) * per_chunk  # items received into the pool
    slots = min(ahead, scattered)  # reduce-scatter items come first, so slot item % slots is free again
    pool = flat.new_empty(slots * seg_len)
    send_to, recv_from = group[steps[0].send_to], group[steps[0].recv_from]

    def region(item: int, sending: bool) -> torch.Tensor:
        index, seg = divmod(item, per_chunk)
        step = steps[index]
        chunk = step.send_chunk if sending else step.recv_chunk
        a, b = cuts[chunk][seg]
        if sending and partials is not None and index > 0:
            return partials[index - 1].narrow(0, seg * seg_len, b - a)
        if not sending and step.phase == REDUCE_SCATTER:
            return pool.narrow(0, (item % slots) * seg_len, b - a)
        return flat[bounds[chunk][0] + a:bounds[chunk][0] + b]

    recvs: dict[int, tuple[torch.Tensor, Any]] = {}
    sends: dict[int, Any] = {}

    def post_recv(item: int) -> None:
        buf = region(item, sending=False)
        recvs[item] = (buf, dist.irecv(buf, recv_from) if buf.numel() else None)

    def post_send(item: int) -> None:
        buf = region(item, sending=True)
        sends[item] = dist.isend(buf, send_to) if buf.numel() else None

    for item in range(min(ahead, items)):
        post_recv(item)
    for item in range(min(per_chunk, items)):  # the first step sends this rank's own data
        post_send(item)
    for item in range(items):
        buf, work = recvs.pop(item)
        if work is not None:
            work.wait()
        # the send of one step earlier must be out before this reduce may overwrite its partials
        work = sends.pop(item - per_chunk, None)
        if work is not None:
            work.wait()
        index, seg = divmod(item, per_chunk)
        if steps[index].phase == REDUCE_SCATTER and buf.numel():
            chunk = steps[index].recv_chunk
            a, b = cuts[chunk][seg]
            local = flat[bounds[chunk][0] + a:bounds[chunk][0] + b]
            if partials is None:
                target = local
            elif index == len(steps) - 1:  # the last step writes the result, laid out as the chunk
                target = partials[index][a:b]
            else:  # a fixed slot per segment, so segments of chunks of different lengths never overlap
                target = partials[index].narrow(0, seg * seg_len, b - a)
            reduce(local, buf, target)  # type: ignore[misc]
        if item + per_chunk < items:
            post_send(item + per_chunk)  # forward what just arrived
        if item + ahead < items:
            post_recv(item + ahead)  # reuses the pool slot just reduced
    for work in sends.values():
        if work is not None:
            work.wait()


# --------------------------------------------------------------------------------------------------
# The public collectives
# --------------------------------------------------------------------------------------------------

def _check_out(out: torch.Tensor | None, numel: int, like: torch.Tensor, what: str) -> torch.Tensor:
    """`out`, checked (contiguous, `numel` elements, like's dtype and device), or a new tensor if None."""
    if out is None:
        return like.new_empty(numel)
    if not isinstance(out, torch.Tensor) or out.numel() != numel or out.dtype != like.dtype \
            or out.device != like.device or not out.is_contiguous():
        got = (f"{tuple(out.shape)} {out.dtype} on {out.device}, contiguous={out.is_contiguous()}"
               if isinstance(out, torch.Tensor) else type(out).__name__)
        raise ValueError(f"out must be a contiguous tensor of {numel} elements ({what}) of {like.dtype} on "
                         f"{like.device}; got {got}. Pass out=None to have one allocated")
    return out.view(-1)


def ring_reduce_scatter(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM, ranks: Sequence[int] | None = None,
                        *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Ring reduce-scatter (Patarasuk & Yuan 2009): the reduction of chunk i of the flattened tensor
    lands on the rank at position i of `ranks`, with chunks as in chunk_bounds(tensor.numel(), p).

    Returns this rank's reduced chunk as a 1-D tensor: `out` if given (preallocated, as with
    torch.distributed.reduce_scatter_tensor), else a new one. `tensor` is not modified: the partial
    result of step s lives in a spare chunk-sized buffer until step s + 1 has sent it on. Every rank
    must pass a tensor with the same number of elements and dtype.
    Cost: (p - 1) alpha + (p - 1)/p n beta + (p - 1)/p n gamma for n bytes per rank.
    """
    group, pos = participants(ranks)
    reduce = reducer(op)
    flat = flatten(tensor)
    bounds = chunk_bounds(flat.numel(), len(group))
    lo, hi = bounds[pos]
    result = _check_out(out, hi - lo, flat, "this rank's chunk")
    if len(group) == 1 or flat.numel() == 0:
        result.copy_(flat)
    else:
        steps = [s for s in ring_steps(len(group), pos) if s.phase == REDUCE_SCATTER]
        per_chunk, seg_len = _segmenting(bounds, flat.element_size())
        spares = [flat.new_empty(per_chunk * seg_len) for _ in range(min(2, len(steps) - 1))]
        partials = [spares[s % 2] for s in range(len(steps) - 1)] + [result]
        _ring_pipeline(flat, bounds, group, steps, reduce, partials)
    return result if out is None else out


def ring_all_gather(tensor: torch.Tensor, ranks: Sequence[int] | None = None, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Ring all-gather (Patarasuk & Yuan 2009): every rank's tensor, concatenated along dim 0 in `ranks`
    order (a 0-d tensor counts as shape (1,)). Every rank must pass the same shape and dtype.

    Each of the p - 1 steps forwards to the next rank the block received in the step before. The
    result goes into `out` if given (p * tensor.numel() elements, preallocated as with
    torch.distributed.all_gather_into_tensor), else into a new tensor.
    Cost: (p - 1) alpha + (p - 1)/p n beta for n bytes of output.
    """
    group, pos = participants(ranks)
    flat = flatten(tensor)
    p, m = len(group), flat.numel()
    shape = tuple(tensor.shape) or (1,)
    result = _check_out(out, p * m, flat, "p * tensor.numel()")
    result[pos * m:(pos + 1) * m].copy_(flat)
    if p > 1 and m:
        steps = [s for s in ring_steps(p, pos) if s.phase == ALL_GATHER]
        _ring_pipeline(result, [(i * m, (i + 1) * m) for i in range(p)], group, steps)
    return result.view(p * shape[0], *shape[1:])


def ring_all_reduce(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
                    ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Ring all-reduce in place: a ring reduce-scatter, then a ring all-gather (Patarasuk & Yuan 2009).

    Follows ring_all_reduce_schedule(p) step by step, each chunk cut into segments of at most
    SEGMENT_BYTES that stream around the ring (see _ring_pipeline). Returns `tensor`.
    Cost: 2 (p - 1) alpha + 2 (p - 1)/p n beta + (p - 1)/p n gamma for n bytes per rank.
    """
    group, pos = participants(ranks)
    reduce = reducer(op)
    flat = flatten(tensor)
    if len(group) == 1 or flat.numel() == 0:
        return tensor
    _ring_pipeline(flat, chunk_bounds(flat.numel(), len(group)), group, ring_steps(len(group), pos), reduce)
    return write_back(tensor, flat)
