"""Every collective that ZeRO calls, wrapped so that the bytes each rank sends are recorded.

The ZeRO paper (Rajbhandari et al. 2020, sec. 7) counts communication per rank with the ring algorithms
of chapter 1: on a group of N ranks, a reduce-scatter of a buffer of B bytes sends (N - 1)/N x B from
each rank (N - 1 steps, one chunk of B/N each), an all-gather into a buffer of B bytes sends the same,
and an all-reduce (a reduce-scatter followed by an all-gather) sends twice that, 2 (N - 1)/N x B. A
`CommLog` records, for every call, the op, the size of the whole buffer B, the group size N, and those
bytes sent; the lab and the tests compare the sums with the paper's 2 Psi and 3 Psi.

The wrappers call `reduce_scatter_single` and `all_gather_single` (torch 2.13's names for
`reduce_scatter_tensor` and `all_gather_into_tensor`, taken from `distlab.dist_compat` so that an older
torch works too); gloo implements both on CPU and NCCL on GPU. ZeRO pads its flat buffers to a multiple
of N elements (see `flat`), so its byte counts are exact integers; for other buffers (PowerSGD's) the
count is rounded down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
from torch import Tensor

from distlab.dist_compat import all_gather_single, reduce_scatter_single

# How many times a ring collective sends (N - 1)/N of the buffer from each rank.
RING_PASSES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}


@dataclass(frozen=True)
class CommRecord:
    """One collective call: `buffer_bytes` is B, the whole (unsharded) buffer; `sent_bytes` is what this
    rank sends under the ring algorithm, passes x (N - 1) x B / N."""

    op: str
    buffer_bytes: int
    group_size: int
    tag: str = ""

    @property
    def sent_bytes(self) -> int:
        n = self.group_size
        return RING_PASSES[self.op] * (n - 1) * self.buffer_bytes // n


@dataclass
class CommLog:
    """The collectives one rank called, in order. `sent_bytes(op)` sums what this rank sent."""

    records: list[CommRecord] = field(default_factory=list)

    def add(self, op: str, buffer_bytes: int, group_size: int, tag: str = "") -> None:
        self.records.append(CommRecord(op, buffer_bytes, group_size, tag))

    def sent_bytes(self, op: str | None = None) -> int:
        """Bytes this rank sent, in all calls or in calls of one `op`."""
        return sum(r.sent_bytes for r in self.records if op is None or r.op == op)

    def buffer_bytes(self, op: str | None = None) -> int:
        """The sum of B over the calls (what the paper's Psi counts, in bytes)."""
        return sum(r.buffer_bytes for r in self.records if op is None or r.op == op)

    def clear(self) -> None:
        self.records.clear()


def _log(log: CommLog | None, op: str, buffer: Tensor, group: dist.ProcessGroup | None, tag: str) -> None:
    if log is not None:
        log.add(op, buffer.numel() * buffer.element_size(), dist.get_world_size(group), tag)


def all_reduce(tensor: Tensor, group: dist.ProcessGroup | None = None, log: CommLog | None = None,
               tag: str = "") -> None:
    """Sum `tensor` over `group`, in place; B = the tensor's bytes."""
    _log(log, "all_reduce", tensor, group, tag)
    dist.all_reduce(tensor, group=group)


def reduce_scatter(shard: Tensor, full: Tensor, group: dist.ProcessGroup | None = None,
                   log: CommLog | None = None, tag: str = "", async_op: bool = False) -> dist.Work | None:
    """`shard` (len B/N) := the sum over `group` of this rank's chunk of `full` (len B); rank i of the
    group gets chunk i. With `async_op=True` returns the work handle: `.wait()` before reading `shard`."""
    _log(log, "reduce_scatter", full, group, tag)
    return reduce_scatter_single(shard, full, group=group, async_op=async_op)


def all_gather(full: Tensor, shard: Tensor, group: dist.ProcessGroup | None = None,
               log: CommLog | None = None, tag: str = "", async_op: bool = False) -> dist.Work | None:
    """`full` (len B) := the concatenation of every rank's `shard` in group-rank order. With
    `async_op=True` returns the work handle: call `.wait()` before reading `full`."""
    _log(log, "all_gather", full, group, tag)
    return all_gather_single(full, shard, group=group, async_op=async_op)


def ring_sent_bytes(op: str, buffer_bytes: int, group_size: int) -> int:
    """The bytes one rank sends in a ring `op` on a buffer of `buffer_bytes` over `group_size` ranks."""
    if op not in RING_PASSES:
        raise ValueError(f"op={op!r} is not a ring collective; choose one of {', '.join(RING_PASSES)}")
    return CommRecord(op, buffer_bytes, group_size).sent_bytes

