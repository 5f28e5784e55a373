"""The tuned ring: reduce-scatter, all-gather and all-reduce whose chunks stream around in segments.

Same schedule as the textbook ring of `ring.py` (Patarasuk & Yuan 2009; `ring_steps`), but every chunk
is cut into segments, and a segment is forwarded as soon as it has arrived and been reduced, while the
next ones are still on the wire, as in gloo's own ring all-reduce. Receives are posted a few segments
ahead, because gloo moves a message only once its receive is posted. How long a segment is and how many
receives go ahead is the `Segmenting` passed as `segmenting=` (default `segmenting.DEFAULT`).

With k = ceil(c / S) segments of at most S bytes per chunk of c = n / p bytes, a reduce-scatter step costs
k alpha + c max(beta, gamma) + min(c, S) min(beta, gamma): reducing hides behind receiving, except for
the last segment (see `cost_model.ring_reduce_scatter_time`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed import ProcessGroup, ReduceOp

from distlab.collectives.p2p import Reduce, Team, flatten, reducer, team, write_back
from distlab.collectives.ring import ALL_GATHER, REDUCE_SCATTER, RingStep, chunk_bounds, ring_steps
from distlab.collectives.segmenting import DEFAULT, Segmenting
from distlab.collectives.workspace import Workspace, check_workspace, scratch

# --------------------------------------------------------------------------------------------------
# The plan: which buffer every segment of every step is sent from, received into and reduced into
# --------------------------------------------------------------------------------------------------


def _segments_per_chunk(bounds: list[tuple[int, int]], element_size: int, seg: Segmenting) -> tuple[int, int]:
    """(segments per chunk, elements in the longest segment) for chunks `bounds`."""
    largest = bounds[0][1] - bounds[0][0]  # chunk_bounds puts the longest chunk first
    nbytes = largest * element_size
    per_chunk = max(-(-nbytes // seg.segment_bytes), 2 if nbytes >= 2 * seg.min_segment_bytes else 1)
    return per_chunk, -(-largest // per_chunk)


@dataclass
class _Plan:
    """Ring `steps` over `flat` as a stream of items: item i is segment i % S of step i // S.

    Reduce-scatter items are received into a small pool of `slots` segments and reduced into `flat`, or,
    with `partials`, into partials[s] for step s (step s + 1 sends it on; all but the last hold S segment
    slots of the longest segment's length), which leaves `flat` untouched. All-gather items are received
    straight into `flat`.
    """

    flat: torch.Tensor
    bounds: list[tuple[int, int]]
    steps: list[RingStep]
    per_chunk: int
    seg_len: int
    pool: torch.Tensor
    slots: int
    partials: list[torch.Tensor] | None
    cuts: list[list[tuple[int, int]]]  # cuts[c][k]: (start, stop) of segment k within chunk c

    @classmethod
    def make(cls, flat: torch.Tensor, bounds: list[tuple[int, int]], steps: list[RingStep], seg: Segmenting,
             partials: list[torch.Tensor] | None, workspace: Workspace | None = None) -> _Plan:
        per_chunk, seg_len = _segments_per_chunk(bounds, flat.element_size(), seg)
        # Receive slots: pipeline_depth, or fewer when the reduce-scatter has fewer items. Fresh pages
        # cost a page fault each on first touch, so a caller that calls often keeps them in a workspace.
        slots = min(seg.pipeline_depth, sum(s.phase == REDUCE_SCATTER for s in steps) * per_chunk)
        cuts = [chunk_bounds(hi - lo, per_chunk) for lo, hi in bounds]
        pool = scratch(workspace, "receive pool", flat, slots * seg_len)
        return cls(flat, bounds, steps, per_chunk, seg_len, pool, slots, partials, cuts)

    @property
    def items(self) -> int:
        return len(self.steps) * self.per_chunk

    def _part(self, chunk: int, seg: int) -> tuple[int, int]:
        """(start, stop) of segment `seg` of `chunk` within the chunk."""
        return self.cuts[chunk][seg]

    def _in_flat(self, chunk: int, seg: int) -> torch.Tensor:
        a, b = self._part(chunk, seg)
        return self.flat[self.bounds[chunk][0] + a:self.bounds[chunk][0] + b]

    def send_buffer(self, item: int) -> torch.Tensor:
        index, seg = divmod(item, self.per_chunk)
        chunk = self.steps[index].send_chunk
        if self.partials is not None and index > 0:  # what the previous step reduced
            a, b = self._part(chunk, seg)
            return self.partials[index - 1].narrow(0, seg * self.seg_len, b - a)
        return self._in_flat(chunk, seg)

    def recv_buffer(self, item: int) -> torch.Tensor:
        index, seg = divmod(item, self.per_chunk)
        step = self.steps[index]
        if step.phase == ALL_GATHER:
            return self._in_flat(step.recv_chunk, seg)
        a, b = self._part(step.recv_chunk, seg)
        return self.pool.narrow(0, (item % self.slots) * self.seg_len, b - a)

    def reduce_into(self, item: int, received: torch.Tensor, reduce: Reduce) -> None:
        """Reduce a received reduce-scatter segment with this rank's own data (all-gather: nothing)."""
        index, seg = divmod(item, self.per_chunk)
        if self.steps[index].phase != REDUCE_SCATTER or not received.numel():
            return
        local = self._in_flat(self.steps[index].recv_chunk, seg)
        if self.partials is None:
            target = local
        elif index == len(self.steps) - 1:  # the last step writes the result, laid out as the chunk
            a, b = self._part(self.steps[index].recv_chunk, seg)
            target = self.partials[index][a:b]
        else:  # a fixed slot per segment, so segments of chunks of different lengths never overlap
            target = self.partials[index].narrow(0, seg * self.seg_len, received.numel())
        reduce(local, received, target)


# --------------------------------------------------------------------------------------------------
# Streaming the plan around the ring
# --------------------------------------------------------------------------------------------------

def _wait(work: Any) -> None:
    if work is not None:
        work.wait()


def _stream(t: Team, plan: _Plan, reduce: Reduce | None) -> None:
    """Run the plan: the segment sent in item i + S is the one received in item i, so it goes on as
    soon as item i has arrived and been reduced; receives are posted pipeline_depth items ahead."""
    items, per_chunk, ahead = plan.items, plan.per_chunk, t.segmenting.pipeline_depth
    isend = t.sender(plan.flat, plan.steps[0].send_to)  # every message goes to the same neighbour
    irecv = t.receiver(plan.flat, plan.steps[0].recv_from)
    received: list[torch.Tensor | None] = [None] * items  # item -> its receive buffer, until reduced
    recvs: list[Any] = [None] * items  # item -> its pending receive (None: nothing to receive)
    sends: list[Any] = [None] * items  # item -> its pending send

    def post_recv(item: int) -> None:
        buf = received[item] = plan.recv_buffer(item)
        recvs[item] = irecv(buf) if buf.numel() else None

    def post_send(item: int) -> None:
        buf = plan.send_buffer(item)
        sends[item] = isend(buf) if buf.numel() else None

    for item in range(min(ahead, items)):
        post_recv(item)
    for item in range(min(per_chunk, items)):  # the first step sends this rank's own data
        post_send(item)
    for item in range(items):
        _wait(recvs[item])
        if item >= per_chunk:
            _wait(sends[item - per_chunk])  # out before this reduce may overwrite its partials
            sends[item - per_chunk] = None
        if reduce is not None:
            plan.reduce_into(item, received[item], reduce)
        if item + per_chunk < items:
            post_send(item + per_chunk)  # forward what just arrived
        if item + ahead < items:
            post_recv(item + ahead)  # reuses the pool slot just reduced
    for work in sends:
        _wait(work)


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


def ring_reduce_scatter(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM, group: ProcessGroup | None = None,
                        *, out: torch.Tensor | None = None, segmenting: Segmenting = DEFAULT,
                        workspace: Workspace | None = None) -> torch.Tensor:
    """Ring reduce-scatter (Patarasuk & Yuan 2009): the reduction of chunk i of the flattened tensor
    lands on rank i of `group`, with chunks as in chunk_bounds(tensor.numel(), p).

    Returns this rank's reduced chunk as a 1-D tensor: `out` if given (preallocated, as with
    torch.distributed.reduce_scatter_tensor), else a new one. `tensor` is not modified: the partial
    result of step s lives in a spare chunk-sized buffer until step s + 1 has sent it on. Every rank
    must pass a tensor with the same number of elements and dtype. `workspace`: a `Workspace` the
    caller keeps across calls for the receive pool and the spare chunks (None: allocated per call).
    Cost: (p - 1) alpha + (p - 1)/p n beta + (p - 1)/p n gamma for n bytes per rank.
    """
    check_workspace(workspace)
    t = team(group, segmenting)
    reduce, flat = reducer(op), flatten(tensor)
    bounds = chunk_bounds(flat.numel(), t.size)
    lo, hi = bounds[t.pos]
    result = _check_out(out, hi - lo, flat, "this rank's chunk")
    if t.size == 1 or flat.numel() == 0:
        result.copy_(flat)
        return result if out is None else out
    steps = [s for s in ring_steps(t.size, t.pos) if s.phase == REDUCE_SCATTER]
    per_chunk, seg_len = _segments_per_chunk(bounds, flat.element_size(), segmenting)
    spares = [scratch(workspace, f"partial {i}", flat, per_chunk * seg_len)
              for i in range(min(2, len(steps) - 1))]
    partials = [spares[s % 2] for s in range(len(steps) - 1)] + [result]
    _stream(t, _Plan.make(flat, bounds, steps, segmenting, partials, workspace), reduce)
    return result if out is None else out


def ring_all_gather(tensor: torch.Tensor, group: ProcessGroup | None = None, *,
                    out: torch.Tensor | None = None, segmenting: Segmenting = DEFAULT) -> torch.Tensor:
    """Ring all-gather (Patarasuk & Yuan 2009): every rank's tensor, concatenated along dim 0 in rank
    order of `group` (a 0-d tensor counts as shape (1,)). Every rank must pass the same shape and dtype.

    Each of the p - 1 steps forwards to the next rank the block received in the step before. The
    result goes into `out` if given (p * tensor.numel() elements, preallocated as with
    torch.distributed.all_gather_into_tensor), else into a new tensor.
    Cost: (p - 1) alpha + (p - 1)/p n beta for n bytes of output.
    """
    t = team(group, segmenting)
    flat = flatten(tensor)
    p, m = t.size, flat.numel()
    shape = tuple(tensor.shape) or (1,)
    result = _check_out(out, p * m, flat, "p * tensor.numel()")
    result[t.pos * m:(t.pos + 1) * m].copy_(flat)
    if p > 1 and m:
        steps = [s for s in ring_steps(p, t.pos) if s.phase == ALL_GATHER]
        blocks = [(i * m, (i + 1) * m) for i in range(p)]
        _stream(t, _Plan.make(result, blocks, steps, segmenting, None), None)
    return result.view(p * shape[0], *shape[1:])


def segmented_ring_all_reduce(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
                              group: ProcessGroup | None = None, *, segmenting: Segmenting = DEFAULT,
                              workspace: Workspace | None = None) -> torch.Tensor:
    """Ring all-reduce in place whose chunks stream around the ring in segments (Patarasuk & Yuan 2009;
    segmenting as in gloo's ring). Same steps as ring_all_reduce_schedule(p); returns `tensor`.
    `workspace`: a `Workspace` the caller keeps across calls for the receive pool (None: one per call).

    Cost: 2 (p - 1) alpha + 2 (p - 1)/p n beta + (p - 1)/p n gamma for n bytes per rank, with each
    chunk's alpha paid once per segment and all but the last segment's reduction hidden.
    """
    check_workspace(workspace)
    return _segmented_ring_all_reduce(team(group, segmenting), tensor, op, workspace)


def _segmented_ring_all_reduce(t: Team, tensor: torch.Tensor, op: ReduceOp,
                               workspace: Workspace | None = None) -> torch.Tensor:
    reduce, flat = reducer(op), flatten(tensor)
    if t.size == 1 or flat.numel() == 0:
        return tensor
    plan = _Plan.make(flat, chunk_bounds(flat.numel(), t.size), ring_steps(t.size, t.pos), t.segmenting, None,
                      workspace)
    _stream(t, plan, reduce)
    return write_back(tensor, flat)
