"""A world of thousands of ranks in one process: torch's fake process group.

`init_process_group("fake", store=FakeStore(), rank=r, world_size=n)` (torch.testing's `fake_pg`, the
backend PyTorch's own tests and torchtitan's `--comm.mode fake_backend` dry run use) makes this process
rank r of n: every group of a `DeviceMesh` over the n ranks can be made, and every collective returns at
once without sending anything. Outputs it can make from this rank's input are filled from it (an
all-gather copies the input into every slot, a reduce-scatter returns this rank's chunk unreduced, an
all-to-all copies, so do gather and scatter at the root); all-reduce, broadcast, reduce, send, recv and
barrier leave the buffers as they were (torch's `FakeProcessGroup.hpp`). No value is right. With the
meta device (tensors with a shape and a dtype but no storage) the course's code then runs one rank's
step of a layout of 16,384 GPUs on a laptop: every call it makes reaches the dispatcher, where
`distlab.comm_log` records it, and no value is computed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

__all__ = ["fake_world"]


@contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    """Be rank `rank` of a fake world of `world_size` ranks inside the block (and nothing after it)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive integer (the ranks of the layout)")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is not a rank of a world of {world_size}; choose 0 <= rank < "
                         f"{world_size}")
    if dist.is_initialized():
        raise ValueError("a process group is already initialized in this process; a dry run makes its own "
                         "fake world: run it outside distlab.launch.run / torchrun, or destroy the group "
                         "first")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
