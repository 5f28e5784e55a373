"""Message framing between the parameter server and its workers, on torch.distributed send/recv.

Every message is two point-to-point transfers between the same pair of ranks:

1. a header, a fixed int64 tensor of `HEADER_LEN` = 4 fields: `[kind, worker, version, length]`;
2. a float32 payload of `length` elements (skipped when length is 0).

The receiver learns from the header how big a buffer the payload needs, as a TCP-based parameter server
does with its message headers (Li et al. 2014, sec. 4). `kind` is one of `Kind`:

| kind | sent by | version field | payload |
| --- | --- | --- | --- |
| PULL | worker | -1 | none: "send me the parameters" (the first message of a worker) |
| PUSH | worker | the parameter version the gradient was computed at | the flat gradient |
| PARAMS | server | the version of the parameters sent | the flat parameters |
| STOP | server | the final version | none: "training is over" |
| BYE | worker | the last version it saw | none: "understood, I am leaving" (ends the server's listener) |

Messages between one pair of ranks arrive in the order they were sent, so a payload always follows its
own header. `recv_message(src=None)` receives from whichever rank sends first (gloo returns the sender);
the parameter server instead gives every worker its own two-rank process group and listens to each
on its own thread, so that a worker that dies breaks only its own connection.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch
import torch.distributed as dist

HEADER_LEN = 4  # kind, worker, version, length


class Kind(enum.IntEnum):
    """What a message is; the first field of every header."""

    PULL = 0
    PUSH = 1
    PARAMS = 2
    STOP = 3
    BYE = 4


class Message(NamedTuple):
    """A received message: the four header fields and the payload (None when length is 0)."""

    kind: Kind
    worker: int
    version: int
    payload: torch.Tensor | None
    sender: int


def header(kind: Kind, worker: int, version: int, length: int) -> torch.Tensor:
    """The header tensor of a message: int64 `[kind, worker, version, length]`."""
    return torch.tensor([int(kind), worker, version, length], dtype=torch.int64)


def send_message(kind: Kind, worker: int, version: int, payload: torch.Tensor | None, dst: int,
                 group: dist.ProcessGroup | None = None) -> None:
    """Send one framed message to rank `dst`: the header, then the payload if there is one."""
    length = 0 if payload is None else payload.numel()
    dist.send(header(kind, worker, version, length), dst, group=group)
    if payload is not None and length:
        dist.send(payload.detach().reshape(-1).float().contiguous(), dst, group=group)


def recv_message(src: int | None = None, group: dist.ProcessGroup | None = None) -> Message:
    """Receive one framed message from `src`, or from whichever rank sends first when `src` is None.

    Raises RuntimeError (from gloo) when nothing arrives within the group's timeout.
    """
    h = torch.empty(HEADER_LEN, dtype=torch.int64)
    sender = dist.recv(h, src, group=group)
    kind, worker, version, length = (int(v) for v in h)
    payload = None
    if length:
        payload = torch.empty(length, dtype=torch.float32)
        dist.recv(payload, sender, group=group)
    return Message(Kind(kind), worker, version, payload, sender)
