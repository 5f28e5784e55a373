"""Message framing between the parameter server and its workers, on torch.distributed send/recv.

Every message is two point-to-point transfers between the same pair of ranks of one process group (the
parameter-server job's group; ranks are positions in it, the server at 0):

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
own header. The server listens to each worker on its own thread, always naming the sender
(`recv_message(group_src=w, ...)`): gloo keeps one connection per pair of ranks, so a worker that dies
breaks its own connection and fails only the receives from it. Every transfer waits at most `timeout`
seconds, so that a rank whose peer has gone silent fails with a clear error instead of hanging.
"""

from __future__ import annotations

import datetime
import enum
from typing import NamedTuple

import torch
import torch.distributed as dist

from distlab import staged_p2p

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
    sender: int  # the sender's position in the group


def header(kind: Kind, worker: int, version: int, length: int) -> torch.Tensor:
    """The header tensor of a message: int64 `[kind, worker, version, length]`."""
    return torch.tensor([int(kind), worker, version, length], dtype=torch.int64)


def send_message(kind: Kind, worker: int, version: int, payload: torch.Tensor | None, group_dst: int,
                 group: dist.ProcessGroup | None = None, timeout: float | None = None) -> None:
    """Send one framed message to position `group_dst` of `group` (None: the whole world): the header,
    then the payload if there is one; each waits at most `timeout` seconds (None: the group's timeout)."""
    length = 0 if payload is None else payload.numel()
    _transfer(staged_p2p.isend(header(kind, worker, version, length), group=group, group_dst=group_dst),
              timeout)
    if payload is not None and length:
        data = payload.detach().reshape(-1).float().contiguous()
        _transfer(staged_p2p.isend(data, group=group, group_dst=group_dst), timeout)


def recv_message(group_src: int, group: dist.ProcessGroup | None = None,
                 timeout: float | None = None) -> Message:
    """Receive one framed message from position `group_src` of `group` (None: the whole world).

    Raises RuntimeError (from gloo) when nothing arrives within `timeout` seconds (None: the group's
    timeout) or when the sender's connection breaks.
    """
    h = torch.empty(HEADER_LEN, dtype=torch.int64)
    _transfer(staged_p2p.irecv(h, group=group, group_src=group_src), timeout)
    kind, worker, version, length = (int(v) for v in h)
    payload = None
    if length:
        payload = torch.empty(length, dtype=torch.float32)
        _transfer(staged_p2p.irecv(payload, group=group, group_src=group_src), timeout)
    return Message(Kind(kind), worker, version, payload, group_src)


def _transfer(work: dist.Work | None, timeout: float | None) -> None:
    """Wait for one send or receive, at most `timeout` seconds."""
    if work is None:  # pragma: no cover - only on a rank outside the group, which run_rank refuses
        return
    if timeout is None:
        work.wait()
    else:
        work.wait(timeout=datetime.timedelta(seconds=timeout))
