"""torch.distributed's flat-tensor collectives under the names torch 2.13 gives them, on older torch too.

torch 2.13 (the course's pin) renamed `reduce_scatter_tensor` to `reduce_scatter_single` and
`all_gather_into_tensor` to `all_gather_single`, and deprecates the old names. Many GPU nodes come with an
older torch already installed (the H100 node behind `assets/gpu/` had 2.11, which has only the old names),
so every chapter calls these two functions instead of `dist.<name>` directly: the pinned torch gets the
new name, an older one the old name. Both issue the same c10d op, so the communication log
(`distlab.comm_log`) records the same call either way.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor


def reduce_scatter_single(output: Tensor, input: Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
                          group: dist.ProcessGroup | None = None,
                          async_op: bool = False) -> dist.Work | None:
    """`output` (len B/N) := the `op`-reduction over `group` of this rank's chunk of `input` (len B)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, op=op, group=group, async_op=async_op)


def all_gather_single(output: Tensor, input: Tensor, group: dist.ProcessGroup | None = None,
                      async_op: bool = False) -> dist.Work | None:
    """`output` (len B) := every rank's `input` (len B/N), concatenated in group-rank order."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)
