"""Point-to-point messages between the ranks of one pipeline, addressed by their position in its group.

A pipeline runs inside a process group (the whole world, or one dim of a `distlab.mesh` grid), and
every peer here is a position in that group (`group_dst=` / `group_src=`), never a global rank, so
the same schedule runs on the world or on each of several independent pipelines.

On gloo, a send is an `isend` that never blocks the caller; it is kept until `finish()`, and every
message carries its own tag, so two messages between the same ranks cannot be mixed up. On NCCL, which
ignores tags and matches a pair's messages in order, and whose large sends wait for their receives, a
run of messages is posted as one `batch_isend_irecv` group, so that a send and a receive between two
neighbours progress together (as Megatron-LM's `send_forward_recv_backward` does; Narayanan et al.
2021).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from distlab import staged_p2p


@dataclass
class Message:
    """One side of one message: the tensor to send (or the buffer to receive into), the peer's position
    in the group, and the message's tag (ignored on NCCL)."""

    tensor: Tensor
    peer: int
    tag: int
    send: bool


@dataclass
class PointToPoint:
    """The sends and receives of one rank in one pipeline group; `group=None` is the whole world."""

    group: dist.ProcessGroup | None = None
    pending_sends: list[tuple[dist.Work, Tensor]] = field(default_factory=list)

    @property
    def nccl(self) -> bool:
        return dist.get_backend(self.group) == "nccl"

    def post(self, messages: list[Message]) -> list[dist.Work]:
        """Post a run of messages together; return what must be waited for before the received tensors
        can be used (on gloo the receives; on NCCL the whole group)."""
        if self.nccl:
            ops = [dist.P2POp(dist.isend if msg.send else dist.irecv, msg.tensor, group=self.group,
                              group_peer=msg.peer) for msg in messages]
            return dist.batch_isend_irecv(ops) if ops else []
        works = []
        for msg in messages:
            if msg.send:
                work = staged_p2p.isend(msg.tensor, group=self.group, group_dst=msg.peer, tag=msg.tag)
                self.pending_sends.append((work, msg.tensor))
            else:
                works.append(staged_p2p.irecv(msg.tensor, group=self.group, group_src=msg.peer, tag=msg.tag))
        return works

    def finish(self) -> None:
        """Wait until every send posted so far has been delivered."""
        for work, _ in self.pending_sends:
            work.wait()
        self.pending_sends.clear()

    def exchange(self, tensor: Tensor, peer: int, tag: int = 0) -> Tensor:
        """Send `tensor` to `peer` and receive the peer's tensor of the same shape, both at once (no
        deadlock on either backend); return what was received."""
        received = torch.empty_like(tensor)
        for work in self.post([Message(tensor, peer, tag, True), Message(received, peer, tag, False)]):
            work.wait()
        self.finish()
        return received
