"""The point-to-point layer every collective of chapter 1 is built on, and the checks they share.

Every collective runs inside one process group (`group=`, None = the whole world) and numbers ranks by
their position in that group, 0 .. p - 1. Inside, an algorithm works on a `Team`: the group, the group
ranks that take part (all of them, or a part such as one node of the two-level all-reduce, so that
algorithms compose without creating a process group per call), this rank's position among them, and
the `Segmenting` its messages are cut by. Peers are addressed by their index in the team; the messages go
out with torch.distributed's isend/irecv and `group_dst`/`group_src`.

Besides: turning a `ReduceOp` into a torch function, flattening a tensor, and deadlock-free transfers:
sendrecv (one message each way), exchange, send_all and recv_all (segmented), and exchange_reduce, which
reduces each segment as it lands while later ones are still in flight. The ring (Patarasuk & Yuan 2009)
and the trees, recursive doubling and pairwise exchange (Thakur, Rabenseifner & Gropp 2005) are written
with these and nothing else.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, ReduceOp

from distlab import staged_p2p
from distlab.collectives.segmenting import DEFAULT, Segmenting

# reduce(a, b, out) computes out = a op b elementwise; out may be a or b (in place).
Reduce = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Team:
    """The ranks one algorithm runs on: `members` (group ranks, in the algorithm's order) of `group`.

    Algorithms name peers by their index in `members` (0 .. size - 1); `pos` is this rank's index.
    `sub(indices)` is the team of some of the members, e.g. one node, with no new process group.
    """

    group: ProcessGroup | None
    members: tuple[int, ...]
    pos: int
    segmenting: Segmenting = DEFAULT

    @property
    def size(self) -> int:
        return len(self.members)

    def sub(self, indices: Sequence[int]) -> Team:
        """The team of members[i] for i in `indices` (which must include this rank's position)."""
        return Team(self.group, tuple(self.members[i] for i in indices), list(indices).index(self.pos),
                    self.segmenting)

    def isend(self, tensor: torch.Tensor, to: int) -> Any:
        return staged_p2p.isend(tensor, group=self.group, group_dst=self.members[to])

    def irecv(self, tensor: torch.Tensor, source: int) -> Any:
        return staged_p2p.irecv(tensor, group=self.group, group_src=self.members[source])

    def sender(self, like: torch.Tensor, to: int) -> Callable[[torch.Tensor], Any]:
        """`isend` to member `to` as a function of the tensor alone, for many messages of tensors like
        `like` (same device and dtype): see `_direct`."""
        peer = self.members[to]
        if _direct(like, self.group):
            send = _process_group(self.group).send
            return lambda tensor: send([tensor], peer, 0)
        return lambda tensor: staged_p2p.isend(tensor, group=self.group, group_dst=peer)

    def receiver(self, like: torch.Tensor, source: int) -> Callable[[torch.Tensor], Any]:
        """`irecv` from member `source` as a function of the tensor alone (see `sender`)."""
        peer = self.members[source]
        if _direct(like, self.group):
            recv = _process_group(self.group).recv
            return lambda tensor: recv([tensor], peer, 0)
        return lambda tensor: staged_p2p.irecv(tensor, group=self.group, group_src=peer)


def _process_group(group: ProcessGroup | None) -> ProcessGroup:
    return group if group is not None else dist.group.WORLD


def _direct(like: torch.Tensor, group: ProcessGroup | None) -> bool:
    """Whether messages of tensors like `like` may go straight to the process group's own send and recv.

    `dist.isend(t, group=g, group_dst=d)` checks its arguments and then calls `g.send([t], d, tag)`, the
    same call (and the same c10d op, which `comm_log` sees) made here once the checks have been done for
    the whole collective: `team()` checked the group, and a plain real tensor that `staged_p2p` would not
    stage needs nothing else. At tens of messages per call the checks are a visible part of the time.
    """
    return (type(like) is torch.Tensor and not like.is_complex()
            and not staged_p2p.needs_staging(like.device, dist.get_backend(group)))


def team(group: ProcessGroup | None, segmenting: Segmenting = DEFAULT) -> Team:
    """Check `group` (None = the whole world) and `segmenting`; the team of all the group's ranks."""
    if not dist.is_initialized():
        raise RuntimeError("no process group is initialised: call the collectives inside a function "
                           "started by distlab.launch.run(fn, world_size)")
    if group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"rank {dist.get_rank()} called a collective on a group it is not a member of "
                         "(dist.new_group returns GroupMember.NON_GROUP_MEMBER there); call it only on the "
                         "group's ranks, e.g. with mesh['tp'].get_group(), which is always this rank's own")
    if group is not None and not isinstance(group, ProcessGroup):
        raise ValueError(f"group={group!r} must be a torch.distributed ProcessGroup (e.g. "
                         "mesh['tp'].get_group()) or None for the whole world")
    if not isinstance(segmenting, Segmenting):
        raise ValueError(f"segmenting={segmenting!r} must be a Segmenting, e.g. "
                         "Segmenting(segment_bytes=1 << 20), or left out for segmenting.DEFAULT")
    return Team(group, tuple(range(dist.get_world_size(group))), dist.get_rank(group), segmenting)


def root_position(root: int, p: int, name: str) -> int:
    """Check a root (`src` or `dst`), a rank of the group: 0 .. p - 1."""
    try:
        value = operator.index(root)
    except TypeError:
        value = -1
    if not 0 <= value < p:
        raise ValueError(f"{name}={root!r} is not a rank of the group of {p} rank(s); {name} is a rank "
                         f"in the group (0 .. {p - 1}), not a global rank: use dist.get_group_rank(group, "
                         "global_rank) to convert one")
    return value


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


def segments(numel: int, element_size: int, segmenting: Segmenting) -> list[tuple[int, int]]:
    """(start, stop) of each message a tensor of `numel` elements is sent as (segment_bytes each)."""
    step = max(1, segmenting.segment_bytes // element_size)
    return [(lo, min(lo + step, numel)) for lo in range(0, numel, step)]


def sendrecv(t: Team, send: torch.Tensor, send_to: int, recv: torch.Tensor, recv_from: int) -> None:
    """Send `send` whole to one team member while receiving `recv` whole from another (MPI_Sendrecv).

    The receive is posted before the send, and both before waiting on either: with blocking send/recv
    in the same order on every rank, a ring deadlocks as soon as messages exceed the transport's
    buffers. Empty tensors are not sent (both sides know the sizes).
    """
    works = [t.irecv(recv, recv_from)] if recv.numel() else []
    works += [t.isend(send, send_to)] if send.numel() else []
    for work in works:
        work.wait()


def exchange(t: Team, send: torch.Tensor, send_to: int, recv: torch.Tensor, recv_from: int) -> None:
    """sendrecv in segments of t.segmenting: every receive and send is posted before any is waited on.

    Posting receives early also matters for speed: gloo moves a message only once the receiver has
    posted its receive. batch_isend_irecv is avoided on purpose: gloo has no batched point-to-point to
    map it to, so it gains nothing here, and explicit calls keep the order of messages visible.
    """
    seg = t.segmenting
    works = [t.irecv(recv[lo:hi], recv_from) for lo, hi in segments(recv.numel(), recv.element_size(), seg)]
    works += [t.isend(send[lo:hi], send_to) for lo, hi in segments(send.numel(), send.element_size(), seg)]
    for work in works:
        work.wait()


def send_all(t: Team, tensor: torch.Tensor, to: int) -> None:
    """Blocking send of `tensor` in segments (the matching receive is recv_all or exchange)."""
    exchange(t, tensor, to, tensor[:0], to)


def recv_all(t: Team, tensor: torch.Tensor, source: int) -> None:
    """Blocking receive into `tensor` in segments (the matching send is send_all or exchange)."""
    exchange(t, tensor[:0], source, tensor, source)


def exchange_reduce(t: Team, send: torch.Tensor, send_to: int, recv_from: int, local: torch.Tensor,
                    target: torch.Tensor, reduce: Reduce, pool: torch.Tensor, overlap: bool = False) -> None:
    """Send `send`; set target = local op (what arrives from `recv_from`), segment by segment.

    `pool` (from receive_pool) holds pipeline_depth receive buffers of one segment each: the first
    receives are posted, then all sends, and each segment is reduced as soon as it lands while later
    ones are in flight. overlap=True when `target` is `send` itself (recursive doubling): a segment is
    overwritten only once its send has completed.
    """
    seg, depth = t.segmenting, t.segmenting.pipeline_depth
    parts = segments(local.numel(), local.element_size(), seg)
    buffers = pool.view(depth, -1)
    recvs: deque[Any] = deque()

    def post(i: int) -> None:
        lo, hi = parts[i]
        recvs.append(t.irecv(buffers[i % depth][: hi - lo], recv_from))

    for i in range(min(depth, len(parts))):
        post(i)
    sends = [t.isend(send[lo:hi], send_to) for lo, hi in segments(send.numel(), send.element_size(), seg)]
    waited = 0  # sends waited for so far (a gloo work must be waited for exactly once)
    for i, (lo, hi) in enumerate(parts):
        recvs.popleft().wait()
        if overlap:
            sends[i].wait()
            waited = i + 1
        reduce(local[lo:hi], buffers[i % depth][: hi - lo], target[lo:hi])
        if i + depth < len(parts):
            post(i + depth)
    for work in sends[waited:]:
        work.wait()


def receive_pool(like: torch.Tensor, numel: int, segmenting: Segmenting) -> torch.Tensor:
    """Receive buffers for exchange_reduce of up to `numel` elements: pipeline_depth segments."""
    seg = min(numel, max(1, segmenting.segment_bytes // like.element_size()))
    return like.new_empty(segmenting.pipeline_depth * max(seg, 1))
