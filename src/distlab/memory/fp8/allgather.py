"""ZeRO-3 / FSDP parameters gathered in FP8: half the bytes of a bf16 all-gather, plus one scale.

Under ZeRO-3 (Rajbhandari et al. 2020, sec. 5.3) each rank keeps a slice of every weight, and before a
layer runs the ranks all-gather the whole weight in the compute dtype: 2 bytes per parameter in bf16. An
FP8 linear layer casts that weight to FP8 anyway before its matmul, so the cast can move *before* the
all-gather: each rank quantises its own slice and the ranks gather 1-byte values (torchao's float8
all-gather for FSDP2, `torchao/float8/fsdp_utils.py`: `WeightWithDynamicFloat8CastTensor`'s
`fsdp_pre_all_gather` casts the shard, `fsdp_post_all_gather` wraps the gathered bytes with the scale).

The catch is the scale. A tensorwise scale is max_fp8 / amax of the *whole* weight, which no rank has; the
ranks first all-reduce their slices' amax with MAX (one float32 each, torchao's
`precompute_float8_dynamic_scale_for_fsdp` does one such all-reduce for all the layers together), so every
slice is cast with the same scale and the gathered weight equals quantise-dequantise of the full weight,
bit for bit. Rowwise scales need no agreement when the weight is sharded by rows (FSDP2's `Shard(0)`):
each rank owns whole rows, so each computes its rows' scales alone and they travel with the rows.

`fp8_all_gather` gathers one weight sharded by rows (uneven: ceil(rows / p) rows per rank, the last ones
padded with zeros, as `distlab.memory.zero.fsdp`'s buckets do) and returns the gathered, dequantised
weight; `distlab.comm_log` sees its collectives, and `gather_bytes` predicts them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.comm_log import where
from distlab.dist_compat import all_gather_single
from distlab.memory.fp8.formats import E4M3, Fp8Format
from distlab.memory.fp8.scaling import amax_to_scale, block_amax, quantize

MODES = ("bf16", "tensorwise", "rowwise")


def shard_rows(weight: Tensor, rank: int, world: int) -> Tensor:
    """Rank `rank`'s slice of `weight` by rows: ceil(rows / world) rows, zero-padded at the end."""
    per = -(-weight.shape[0] // world)
    out = torch.zeros(per, *weight.shape[1:], dtype=weight.dtype)
    mine = weight[rank * per:(rank + 1) * per]
    out[: mine.shape[0]] = mine
    return out


def _gather(t: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    p = dist.get_world_size(group)
    out = torch.empty(p * t.shape[0], *t.shape[1:], dtype=t.dtype, device=t.device)
    all_gather_single(out, t.contiguous(), group=group)
    return out


def fp8_all_gather(shard: Tensor, rows: int, mode: str = "tensorwise", group: dist.ProcessGroup | None = None,
                   fmt: Fp8Format = E4M3) -> Tensor:
    """The whole weight (its first `rows` rows) from every rank's `shard`, gathered in `mode`: "bf16" (the
    16-bit baseline), "tensorwise" (FP8, one scale agreed by an all-reduce of the amax) or "rowwise" (FP8,
    one scale per row, gathered with the rows). Returns float32; a collective on `group`."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; choose one of {', '.join(MODES)}")
    if shard.dim() != 2:
        raise ValueError(f"shard has shape {tuple(shard.shape)}; give a 2-D weight slice (rows, columns)")
    p = dist.get_world_size(group)
    if not 0 < rows <= p * shard.shape[0]:
        raise ValueError(f"rows={rows} must be in 1..{p * shard.shape[0]} (world size x shard rows)")
    with where(f"fp8 all-gather ({mode})"):
        if mode == "bf16":
            return _gather(shard.to(torch.bfloat16), group)[:rows].float()
        if mode == "tensorwise":
            amax = block_amax(shard, (None, None)).view(1)
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
            q = quantize(shard, fmt, (None, None), scale=amax_to_scale(amax, fmt).view(1, 1))
            data = _gather(q.data.view(torch.uint8), group).view(fmt.torch_dtype)
            return data[:rows].float() / q.scale
        q = quantize(shard, fmt, (1, None))
        data = _gather(q.data.view(torch.uint8), group).view(fmt.torch_dtype)
        scales = _gather(q.scale, group)
        return (data.float() / scales)[:rows]


def gather_bytes(rows: int, cols: int, world: int, mode: str) -> int:
    """B of each collective `fp8_all_gather` calls, summed (the comm_log's convention: the gathered output,
    the reduced tensor): padded rows x cols x bytes per value, plus the scales."""
    padded = -(-rows // world) * world
    if mode == "bf16":
        return 2 * padded * cols
    if mode == "tensorwise":
        return padded * cols + 4  # the 1-byte values; the float32 amax all-reduced
    if mode == "rowwise":
        return padded * cols + 4 * padded
    raise ValueError(f"mode={mode!r} is unknown; choose one of {', '.join(MODES)}")
