"""Chapter 1: the ring all-reduce at two ranks as an exchange of halves (`ring_two_ranks.exchange_halves`,
which `segmented_ring_all_reduce` runs for a group of two) equals torch.distributed's all-reduce: sizes
that split unevenly, halves with fewer elements than segments, more segments than receives posted ahead,
every reduce op, and on each two-rank group of a four-rank mesh."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from distlab import launch
from distlab.collectives.p2p import reducer, team
from distlab.collectives.ring_two_ranks import exchange_halves
from distlab.collectives.segmented_ring import segmented_ring_all_reduce
from distlab.collectives.segmenting import Segmenting
from distlab.mesh import grid

SIZES = (1, 2, 3, 7, 1000, 4099)
OPS = (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT)


def _data(n: int, i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * i + n)
    return torch.randint(-9, 10, (n,), generator=g).double()  # integers: every order of sums is exact


def _mismatches(group: dist.ProcessGroup | None) -> list[str]:
    i, bad = dist.get_rank(group), []
    for n in SIZES:
        x = _data(n, i)
        for op in OPS:
            want = x.clone()
            dist.all_reduce(want, op=op, group=group)
            for per_chunk, depth in ((1, 1), (3, 2), (5, 3), (9, 4)):
                got = x.clone()
                t = team(group, Segmenting(pipeline_depth=depth))
                exchange_halves(t, got, reducer(op), per_chunk)
                if not torch.equal(got, want):
                    bad.append(f"n={n} op={op} per_chunk={per_chunk} depth={depth}")
        small = Segmenting(segment_bytes=64, pipeline_depth=2, min_segment_bytes=16)
        y = torch.stack([_data(n, i), _data(n, i + 7)], dim=1).t()  # not contiguous
        want = y.clone()
        dist.all_reduce(want, group=group)
        if not torch.equal(segmented_ring_all_reduce(y, group=group, segmenting=small), want):
            bad.append(f"n={n} segmented_ring_all_reduce on a non-contiguous tensor")
    return bad


def _ranks() -> list[str]:
    bad = [f"world: {b}" for b in _mismatches(None)] if dist.get_world_size() == 2 else []
    if dist.get_world_size() == 4:
        mesh = grid(dp=2, tp=2)
        for axis in ("dp", "tp"):
            bad += [f"{axis} group: {b}" for b in _mismatches(mesh[axis].get_group())]
    return bad


def test_exchange_of_halves_equals_the_built_in_at_two_ranks_and_on_two_rank_groups() -> None:
    for world_size in (2, 4):
        results = launch.run(_ranks, world_size, backend="gloo", timeout=120)
        assert results == [[]] * world_size, results
