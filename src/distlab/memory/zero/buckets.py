"""Per-parameter shards packed rank-major, so that one collective moves many parameters (FSDP2's layout).

The chapter's engine (`engine.ZeRO`) shards a unit's flat buffer: a parameter may straddle two ranks. A
torch optimizer wants whole tensors it can skip, count steps for and save by parameter, so the sharded
optimizer and `fully_shard` cut *each parameter* instead, along dim 0 as FSDP2 does (Zhao et al. 2023,
PyTorch FSDP): group-rank i gets rows [i c, (i + 1) c) with c = ceil(rows / N), padded with zero rows. A
slice keeps the parameter's number of dims, so code that groups parameters by `p.dim()` still works.
To reduce-scatter or all-gather many parameters in one call, a `Bucket` lays them out in an (N, S)
buffer, row r holding group-rank r's slices of every parameter side by side: the collective's r-th
chunk is then exactly rank r's shards, contiguous.

A gradient buffer has one more column per parameter, after the slices: each rank writes 1 there, in every
row, for each parameter it computed a gradient of. The reduce-scatter that averages the gradients then
also hands every rank, in its own row, how many ranks used each parameter: who used what travels with
the gradients instead of in a collective of its own (`ShardedOptimizer` reads it; see `uneven`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def shard_shape(shape: Sequence[int], n: int) -> tuple[int, ...]:
    """The shape of one rank's slice of a parameter of `shape` on `n` ranks: ceil(rows / n) rows of dim 0,
    the other dims whole, as FSDP2's `Shard(0)` (the last ranks' rows may be padding). A 0-d parameter
    is one row of one element."""
    if len(shape) == 0:
        return (1,)
    return (-(-shape[0] // n), *shape[1:])


class Bucket:
    """The parameters `params` (one dtype) on `n` ranks: parameter k occupies columns
    `offsets[k] : offsets[k] + sizes[k]` of every row of an (n, `width`) buffer."""

    def __init__(self, params: Sequence[Tensor], n: int) -> None:
        self.params, self.n = list(params), n
        self.shapes = [shard_shape(p.shape, n) for p in self.params]
        self.sizes = [int(torch.Size(s).numel()) for s in self.shapes]
        self.offsets = [0]
        for s in self.sizes:
            self.offsets.append(self.offsets[-1] + s)
        self.width = self.offsets[-1]
        self.dtype = self.params[0].dtype

    def rows(self, buffer: Tensor, k: int) -> Tensor:
        """Parameter k's (n, size) block of an (n, width) buffer."""
        return buffer[:, self.offsets[k]:self.offsets[k + 1]]

    def local(self, shard: Tensor, k: int) -> Tensor:
        """Parameter k's slice of this rank's flat shard (width elements)."""
        return shard[self.offsets[k]:self.offsets[k + 1]]

    def copy_in(self, buffer: Tensor, k: int, value: Tensor) -> None:
        """Write a whole parameter-shaped `value` into parameter k's block, row-major: element e goes
        to row e // size. The padding columns are left as they are (zero, if the buffer started so)."""
        block, s, flat = self.rows(buffer, k), self.sizes[k], value.reshape(-1)
        full = flat.numel() // s
        if full:
            block[:full].copy_(flat[:full * s].view(full, s))
        if full < self.n and flat.numel() > full * s:
            block[full, :flat.numel() - full * s].copy_(flat[full * s:])

    def copy_out(self, buffer: Tensor, k: int, out: Tensor, skip: int | None = None) -> None:
        """The inverse of `copy_in`: parameter k's block of `buffer` into the tensor `out`, leaving out
        row `skip` (the rows this rank updated in place already; None: every row)."""
        block, s, flat = self.rows(buffer, k), self.sizes[k], out.view(-1)
        full = flat.numel() // s
        rows = flat[:full * s].view(full, s)
        for a, b in [(0, full)] if skip is None else [(0, min(skip, full)), (skip + 1, full)]:
            if a < b:
                rows[a:b].copy_(block[a:b])
        if full < self.n and flat.numel() > full * s and skip != full:
            flat[full * s:].copy_(block[full, :flat.numel() - full * s])

    def grad_buffer(self) -> Tensor:
        """A zeroed (n, width + len(params)) buffer for the gradients: the slices, then the usage column
        of every parameter (`mark_used`)."""
        return torch.zeros(self.n, self.width + len(self.params), dtype=self.dtype,
                           device=self.params[0].device)

    def mark_used(self, buffer: Tensor, k: int) -> None:
        """Say, in every row of a gradient buffer, that this rank computed parameter k's gradient."""
        buffer[:, self.width + k] = 1

    def own(self, param: Tensor, k: int, rank: int) -> Tensor:
        """Group-rank `rank`'s rows of parameter k as a *view* of `param` (fewer rows, or none, where the
        padding would start: the padding is only ever in the buffers, never in the parameter)."""
        if not param.is_contiguous():
            raise ValueError(f"parameter {k} of shape {tuple(param.shape)} is not contiguous; make it so "
                             "(p.data = p.data.contiguous()) before sharding")
        rows = param.view(1) if param.dim() == 0 else param
        c = self.shapes[k][0]
        return rows[min(rank * c, len(rows)):min((rank + 1) * c, len(rows))]

    def slice_of(self, value: Tensor, k: int, rank: int) -> Tensor:
        """Group-rank `rank`'s slice of a whole parameter-shaped `value`, flat (padded with zeros)."""
        s, flat = self.sizes[k], value.reshape(-1)
        out = torch.zeros(s, dtype=value.dtype, device=value.device)
        part = flat[rank * s:(rank + 1) * s]
        out[:part.numel()].copy_(part)
        return out


def make_buckets(params: Sequence[Tensor], n: int, cap_numel: int) -> list[Bucket]:
    """Consecutive parameters of one dtype grouped into buckets of at most about `cap_numel` elements
    (a parameter larger than the cap gets a bucket of its own)."""
    buckets: list[list[Tensor]] = []
    size = 0
    for p in params:
        if not buckets or size + p.numel() > cap_numel or buckets[-1][0].dtype != p.dtype:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel()
    return [Bucket(b, n) for b in buckets]
