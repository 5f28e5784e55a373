"""Scratch memory that a caller keeps from one call of a collective to the next.

The segmented ring receives each reduce-scatter segment into a small pool of buffers, and the ring
reduce-scatter keeps its partial results in spare chunks. Allocated afresh on every call, such buffers
cost more than the allocation: a large block comes from the operating system as fresh pages, and each
page costs a page fault (and is zeroed) the first time it is written, thousands of faults for a pool of
a few MB. MPI libraries and NCCL allocate their staging buffers once and keep them; DDP keeps its
buckets (Li et al. 2020). A `Workspace` is that, made explicit: the caller creates one per call site
(one per gradient bucket, one per benchmark contender) and passes it as `workspace=` on every call; the
collective takes its buffers from it, by role, and they are reused whenever the next call needs no
more. Nothing is cached behind the caller's back: without a workspace every call allocates its own.
"""

from __future__ import annotations

import torch


class Workspace:
    """Buffers kept across calls, one per role ("receive pool", "partial 0", ...), each grown as needed.

    `take(role, like, numel)` returns `numel` elements of like's dtype and device: the start of the
    role's buffer, replaced by a new one when it is too short or of another dtype or device. Buffers of
    different roles never overlap. A workspace serves one call at a time (the collectives here are
    synchronous), and what a call leaves in it is scratch, never a result.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, role: str, like: torch.Tensor, numel: int) -> torch.Tensor:
        buf = self._buffers.get(role)
        if buf is None or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._buffers[role] = like.new_empty(numel)
        return buf[:numel]

    def nbytes(self) -> int:
        """The bytes held, over all roles."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


def check_workspace(workspace: object) -> None:
    """A clear error for anything but a Workspace or None, before any message is sent."""
    if workspace is not None and not isinstance(workspace, Workspace):
        raise ValueError(f"workspace must be a distlab.collectives.Workspace or None, got a "
                         f"{type(workspace).__name__}; create one with Workspace() and pass the same one on "
                         "every call from this call site")


def scratch(workspace: Workspace | None, role: str, like: torch.Tensor, numel: int) -> torch.Tensor:
    """`numel` elements of like's dtype and device for `role`: from `workspace`, or new if it is None."""
    return like.new_empty(numel) if workspace is None else workspace.take(role, like, numel)
