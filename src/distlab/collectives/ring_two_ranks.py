"""The ring all-reduce at two ranks, written as what it is there: an exchange of halves.

At p = 2 the ring of `ring.py` has one reduce-scatter step and one all-gather step, both with the one
peer (Patarasuk & Yuan 2009): each rank owns half of the vector, sends the peer its copy of the peer's
half and adds the peer's copy of its own half into it (the reduce-scatter), then sends its reduced half
back and receives the peer's (the all-gather). gloo's ring does exactly this at two ranks, in segments of
at most 1 MiB with two in flight (`gloo/allreduce.cc`, `ring`, and `AllreduceOptions.kMaxSegmentSize`).

What the general streaming ring (`segmented_ring.py`) cannot do, this can, because there is only one peer:

- every reduce-scatter send is this rank's own data, so all of them are posted at once, before any
  receive has landed;
- a segment's all-gather send goes out the moment the segment is reduced, on a second message tag, so
  that it never waits behind the reduce-scatter messages still on the wire, and the peer's all-gather
  receives are posted as soon as the reduce-scatter send of the same segment has left this rank.

The bytes are the ring's, (p - 1)/p n each way per phase, and the cost is the same formula
(`cost_model.ring_all_reduce_time` at p = 2); only the Python work between messages is less.
`segmented_ring_all_reduce` uses it for a group of two.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distlab.collectives.p2p import Reduce, Team
from distlab.collectives.ring import chunk_bounds

REDUCE_SCATTER_TAG, ALL_GATHER_TAG = 0, 1


def _isend(t: Team, tensor: torch.Tensor, tag: int) -> Any:
    """Send to the peer (nothing for an empty segment: both sides know the sizes)."""
    if not tensor.numel():
        return None
    return dist.isend(tensor, group=t.group, group_dst=t.members[1 - t.pos], tag=tag)


def _irecv(t: Team, tensor: torch.Tensor, tag: int) -> Any:
    if not tensor.numel():
        return None
    return dist.irecv(tensor, group=t.group, group_src=t.members[1 - t.pos], tag=tag)


def _wait(work: Any) -> None:
    if work is not None:
        work.wait()


def exchange_halves(t: Team, flat: torch.Tensor, reduce: Reduce, per_chunk: int) -> None:
    """All-reduce `flat` in place between the two members of `t`: this rank's half (chunk_bounds's
    chunk t.pos) is reduced segment by segment as the peer's copy lands, each reduced segment is sent
    back at once, and the peer's reduced half lands in place. Each half goes as `per_chunk` segments
    (the streaming ring's count, `segmented_ring._segments_per_chunk`), at most pipeline_depth
    receives of the reduce-scatter ahead."""
    bounds = chunk_bounds(flat.numel(), 2)
    mine = flat[bounds[t.pos][0]:bounds[t.pos][1]]
    theirs = flat[bounds[1 - t.pos][0]:bounds[1 - t.pos][1]]
    cut_mine, cut_theirs = chunk_bounds(mine.numel(), per_chunk), chunk_bounds(theirs.numel(), per_chunk)
    depth = min(t.segmenting.pipeline_depth, per_chunk)
    seg_len = max(hi - lo for lo, hi in cut_mine + cut_theirs)
    pool = flat.new_empty(depth * seg_len)  # pool slot k % depth receives segment k

    def slot(k: int) -> torch.Tensor:
        return pool.narrow(0, (k % depth) * seg_len, cut_mine[k][1] - cut_mine[k][0])

    recvs = {k: _irecv(t, slot(k), REDUCE_SCATTER_TAG) for k in range(depth)}
    rs_sends = [_isend(t, theirs[lo:hi], REDUCE_SCATTER_TAG) for lo, hi in cut_theirs]
    ag_works = []
    for k, (lo, hi) in enumerate(cut_mine):
        _wait(recvs.pop(k))
        reduce(mine[lo:hi], slot(k), mine[lo:hi])
        ag_works.append(_isend(t, mine[lo:hi], ALL_GATHER_TAG))  # reduced: back to the peer at once
        if k + depth < per_chunk:
            recvs[k + depth] = _irecv(t, slot(k + depth), REDUCE_SCATTER_TAG)
        _wait(rs_sends[k])  # my copy of the peer's segment k has left: its reduced version may land
        ag_works.append(_irecv(t, theirs[cut_theirs[k][0]:cut_theirs[k][1]], ALL_GATHER_TAG))
    for work in ag_works:
        _wait(work)
