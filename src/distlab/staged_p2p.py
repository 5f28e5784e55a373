"""Point-to-point messages that also work for CUDA tensors on gloo: the course's isend, irecv, send, recv.

gloo's collectives accept CUDA tensors (they copy them through host memory), but its send and recv do
not: `ProcessGroupGloo::send` hands the tensor's data pointer to the transport as if it were host memory
(torch/csrc/distributed/c10d/ProcessGroupGloo.cpp). Ranks that share one GPU over gloo
(`DISTLAB_DEVICE=cuda`, `make gpu-check`'s shared mode) hold CUDA tensors, so every send and receive of
the course goes through these four functions. On NCCL, and for a CPU tensor, they are torch's own. For a
CUDA tensor on a gloo group they *stage* the message: a send sends a host copy of the tensor; a receive
lands in a host buffer that `wait()` copies into the tensor. The receiver must wait before reading the
tensor, as for any `irecv`. The host copies carry the attribute `STAGED` (the device they stand for), so
that `gpu_check.rules.RuleLog` accepts them on a rank whose device is a GPU.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch import Tensor

STAGED = "_distlab_staged_from"  # set on a host copy: the device of the tensor it stands for


def needs_staging(device: torch.device, backend: str) -> bool:
    """A tensor on `device` must go through host memory to be sent or received on `backend`: a CUDA
    tensor on gloo."""
    return device.type == "cuda" and backend == "gloo"


def _staged(tensor: Tensor, group: dist.ProcessGroup | None) -> bool:
    return needs_staging(tensor.device, dist.get_backend(group))


def host_copy(tensor: Tensor) -> Tensor:
    """A CPU copy of `tensor` (what a staged send sends), marked as standing for it."""
    host = tensor.detach().to("cpu", copy=True)
    setattr(host, STAGED, tensor.device)
    return host


def host_buffer(tensor: Tensor) -> Tensor:
    """A CPU buffer of `tensor`'s shape and dtype (what a staged receive receives into), marked."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
    setattr(host, STAGED, tensor.device)
    return host


class StagedRecv:
    """A receive into a host buffer: `wait()` waits for it, then copies the buffer into the tensor."""

    def __init__(self, work: dist.Work, host: Tensor, tensor: Tensor) -> None:
        self.work, self.host, self.tensor = work, host, tensor
        self._copied = False

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        done = self.work.wait() if timeout is None else self.work.wait(timeout=timeout)
        if not self._copied:
            self.tensor.copy_(self.host)
            self._copied = True
        return done

    def is_completed(self) -> bool:
        return self.work.is_completed()


def isend(tensor: Tensor, group: dist.ProcessGroup | None = None, group_dst: int | None = None,
          tag: int = 0) -> dist.Work | None:
    """`dist.isend(tensor, group=group, group_dst=group_dst, tag=tag)`, staged where gloo needs it."""
    if _staged(tensor, group):
        tensor = host_copy(tensor)
    return dist.isend(tensor, group=group, group_dst=group_dst, tag=tag)


def irecv(tensor: Tensor, group: dist.ProcessGroup | None = None, group_src: int | None = None,
          tag: int = 0) -> dist.Work | StagedRecv | None:
    """`dist.irecv(tensor, group=group, group_src=group_src, tag=tag)`, staged where gloo needs it
    (then `tensor` holds the message once the returned request's `wait()` has returned)."""
    if not _staged(tensor, group):
        return dist.irecv(tensor, group=group, group_src=group_src, tag=tag)
    host = host_buffer(tensor)
    work = dist.irecv(host, group=group, group_src=group_src, tag=tag)
    return None if work is None else StagedRecv(work, host, tensor)


def send(tensor: Tensor, group: dist.ProcessGroup | None = None, group_dst: int | None = None,
         tag: int = 0) -> None:
    """A blocking `isend`."""
    work = isend(tensor, group=group, group_dst=group_dst, tag=tag)
    if work is not None:
        work.wait()


def recv(tensor: Tensor, group: dist.ProcessGroup | None = None, group_src: int | None = None,
         tag: int = 0) -> None:
    """A blocking `irecv`: `tensor` holds the message when it returns."""
    work = irecv(tensor, group=group, group_src=group_src, tag=tag)
    if work is not None:
        work.wait()
