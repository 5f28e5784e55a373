"""The segmented ring is the textbook ring bit for bit, and its messages stay visible to `comm_log`.

`test_collectives.py` checks parity on integer-valued data, where every order of summation gives the
same floats. Here the data are random floats, so only the same additions in the same order give the
same bits: the segmented ring (any segmenting) must add exactly what the textbook ring adds, in the
same order, so its result is `torch.equal` to `ring_all_reduce`'s. This holds the tuning of
`segmented_ring.py` (how it posts its messages, how it sends them) to the algorithm the chapter teaches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distlab import launch
from distlab.collectives import (
    Segmenting,
    chunk_bounds,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
    segmented_ring_all_reduce,
)
from distlab.comm_log import comm_log

SEGMENTINGS = {
    "default": Segmenting(),
    "small, depth 1": Segmenting(segment_bytes=512, pipeline_depth=1, min_segment_bytes=64),
    "small, depth 3": Segmenting(segment_bytes=4096, pipeline_depth=3, min_segment_bytes=1024),
}
# 300_000 divides by 2, 3 and 4 (the all-gather's case); the small segmentings cut the large sizes finely
SIZES = [1, 5, 1001, 300_000, 300_007]


def _floats(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def _bitwise_cases() -> list[str]:
    """Inside a rank: every difference between the segmented ring and the textbook ring on random floats."""
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []
    for n in SIZES:
        x = _floats(n, seed=1000 * r + n)
        want = ring_all_reduce(x.clone())
        lo, hi = chunk_bounds(n, p)[r]
        for name, seg in SEGMENTINGS.items():
            for call in range(2):  # a second call on the same input gives the same bits
                got = segmented_ring_all_reduce(x.clone(), segmenting=seg)
                if not torch.equal(got, want):
                    failures.append(f"rank {r}: n={n} {name} call {call}: segmented ring differs from the "
                                    f"textbook ring in {int((got != want).sum())} elements")
            if not torch.equal(ring_reduce_scatter(x, segmenting=seg), want[lo:hi]):
                failures.append(f"rank {r}: n={n} {name}: ring_reduce_scatter differs from the ring's chunk")
            if n % p == 0 and not torch.equal(ring_all_gather(want[lo:hi], segmenting=seg), want):
                failures.append(f"rank {r}: n={n} {name}: ring_all_gather does not rebuild the result")
    return failures


def test_segmented_ring_adds_exactly_what_the_textbook_ring_adds() -> None:
    for world_size in (2, 3, 4):
        results = launch.run(_bitwise_cases, world_size, backend="gloo", timeout=120)
        failures = [f for per_rank in results for f in per_rank]
        assert not failures, f"{world_size} ranks:\n" + "\n".join(failures[:20])


def _logged_messages() -> dict[str, int]:
    """Inside a rank: the point-to-point calls comm_log records for one segmented ring all-reduce."""
    seg = Segmenting(segment_bytes=1024, pipeline_depth=2, min_segment_bytes=256)
    x = torch.ones(1000)  # chunks of 500 floats = 2000 B: two segments of 1000 B per chunk
    with comm_log() as log:
        segmented_ring_all_reduce(x, segmenting=seg)
    return {"sends": log.calls(op="send"), "recvs": log.calls(op="recv"), "sent": log.bytes(op="send"),
            "right": int(torch.equal(x, torch.full((1000,), 2.0)))}


def test_segmented_ring_messages_are_seen_by_comm_log() -> None:
    """The ring sends through the process group's own send and recv (no per-message checks): they are
    still the c10d ops that comm_log records, 2 steps x 2 segments each way on 2 ranks."""
    for r, got in enumerate(launch.run(_logged_messages, 2, backend="gloo", timeout=60)):
        assert got == {"sends": 4, "recvs": 4, "sent": 4 * 1000, "right": 1}, f"rank {r}: {got}"
