"""Healing: a replica that comes back (or a new one) takes the model and optimizer state from a live peer.

No disk: the state travels point-to-point over the quorum's process group, from the quorum's `source`
(the lowest replica id at the quorum's step) to every member behind it (torchft's "heal", which sends
its state dict over HTTP or a process group). What travels is everything the next step depends on: the
parameters, the optimizer's state (momentum buffers, Adam's moments and step counts) and the step
number, serialised with `torch.save` into one byte tensor, so any torch optimizer's `state_dict` works
as well as the course's `reference.SGD`. First an 8-byte length, then the bytes: 2 messages per healer.

`make_group` builds the quorum's process group: a fresh gloo group over the quorum's members, ranked by
their place in `Quorum.members`, its rendezvous under the store prefix `pg/{quorum_id}` so that a group
of a later quorum never meets a stale one (torchft's `ProcessGroupGloo.configure` does the same per
quorum). It is not registered with torch.distributed's world: its calls go to the group object itself
(`pg.allreduce([t])`), so a dead member never blocks the default group.
"""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from distlab import reference
from distlab.fault_tolerance.quorum import Quorum


def make_group(store: dist.Store, quorum: Quorum, replica: int, timeout: float) -> dist.ProcessGroup:
    """This replica's gloo group over `quorum.members` (rank = its place among them); a collective that
    waits longer than `timeout` seconds for a peer raises."""
    prefixed = dist.PrefixStore(f"pg/{quorum.quorum_id}", store)
    return dist.ProcessGroupGloo(prefixed, quorum.rank_of(replica), len(quorum.members),
                                 timedelta(seconds=timeout))


def _optimizer_state(optimizer: Any) -> Any:
    if isinstance(optimizer, reference.SGD):
        return {"velocity": optimizer.velocity}
    return optimizer.state_dict()


def _load_optimizer_state(optimizer: Any, state: Any) -> None:
    if isinstance(optimizer, reference.SGD):
        optimizer.velocity = list(state["velocity"])
    else:
        optimizer.load_state_dict(state)


def state_bytes(model: nn.Module, optimizer: Any, step: int) -> torch.Tensor:
    """The replica's whole training state as one uint8 tensor."""
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": _optimizer_state(optimizer), "step": step}, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def load_state_bytes(model: nn.Module, optimizer: Any, data: torch.Tensor) -> int:
    """Load what `state_bytes` made; returns the step."""
    state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)
    model.load_state_dict(state["model"])
    _load_optimizer_state(optimizer, state["optimizer"])
    return int(state["step"])


def send_state(pg: dist.ProcessGroup, quorum: Quorum, model: nn.Module, optimizer: Any, step: int) -> int:
    """On the quorum's source: send the state to every member behind; returns the bytes sent."""
    data = state_bytes(model, optimizer, step)
    for replica in quorum.behind:
        dst = quorum.rank_of(replica)
        pg.send([torch.tensor([data.numel()], dtype=torch.int64)], dst, 0).wait()
        pg.send([data], dst, 1).wait()
    return data.numel() * len(quorum.behind)


def recv_state(pg: dist.ProcessGroup, quorum: Quorum, model: nn.Module, optimizer: Any) -> int:
    """On a member behind: receive the source's state and load it; returns the step it is at."""
    src = quorum.rank_of(quorum.source)
    size = torch.zeros(1, dtype=torch.int64)
    pg.recv([size], src, 0).wait()
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    pg.recv([data], src, 1).wait()
    return load_state_bytes(model, optimizer, data)
