"""The segmented ring is the textbook ring bit for bit, with or without a `Workspace`, and its messages
stay visible to `comm_log`.

`test_collectives.py` checks parity on integer-valued data, where every order of summation gives the
same floats. Here the data are random floats, so only the same additions in the same order give the
same bits: the segmented ring (any segmenting) must add exactly what the textbook ring adds, in the
same order, so its result is `torch.equal` to `ring_all_reduce`'s. This holds the tuning of
`segmented_ring.py` (how it posts its messages, how it sends them) to the algorithm the chapter teaches.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab import launch
from distlab.collectives import (
    Segmenting,
    Workspace,
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
    "16 KiB, depth 4": Segmenting(segment_bytes=16384, pipeline_depth=4, min_segment_bytes=4096),
}
# 30_000 divides by 2, 3 and 4 (the all-gather's case); the small segmentings cut the large sizes finely
SIZES = [1, 5, 1001, 30_000, 30_007]


def _floats(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def _bitwise_cases() -> list[str]:
    """Inside a rank: every difference between the segmented ring and the textbook ring on random floats,
    without a workspace and with one kept across all the calls (sizes, segmentings and dtypes change)."""
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []
    kept = Workspace()
    for n in SIZES:
        for dtype in (torch.float32, torch.float64):
            x = _floats(n, seed=1000 * r + n).to(dtype)
            want = ring_all_reduce(x.clone())
            lo, hi = chunk_bounds(n, p)[r]
            for name, seg in SEGMENTINGS.items():
                case = f"rank {r}: n={n} {dtype} {name}"
                for how, workspace in (("", None), (", workspace", kept), (", workspace again", kept)):
                    got = segmented_ring_all_reduce(x.clone(), segmenting=seg, workspace=workspace)
                    if not torch.equal(got, want):
                        failures.append(f"{case}{how}: segmented ring differs from the textbook ring in "
                                        f"{int((got != want).sum())} elements")
                    got = ring_reduce_scatter(x, segmenting=seg, workspace=workspace)
                    if not torch.equal(got, want[lo:hi]):
                        failures.append(f"{case}{how}: ring_reduce_scatter differs from the ring's chunk")
                if n % p == 0 and not torch.equal(ring_all_gather(want[lo:hi], segmenting=seg), want):
                    failures.append(f"{case}: ring_all_gather does not rebuild the result")
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


def test_a_workspace_keeps_its_buffers_and_grows_them_by_role() -> None:
    like = torch.zeros(3)
    ws = Workspace()
    pool = ws.take("receive pool", like, 100)
    again = ws.take("receive pool", like, 60)
    assert again.data_ptr() == pool.data_ptr() and again.numel() == 60  # reused, not reallocated
    other = ws.take("partial 0", like, 100)
    assert other.data_ptr() != pool.data_ptr()  # roles never share memory
    grown = ws.take("receive pool", like, 200)
    assert grown.numel() == 200 and grown.dtype == torch.float32
    wider = ws.take("receive pool", like.double(), 10)
    assert wider.dtype == torch.float64 and ws.nbytes() == 100 * 4 + 10 * 8


def test_a_workspace_that_is_not_one_is_refused_before_any_message() -> None:
    for call in (lambda: segmented_ring_all_reduce(torch.ones(4), workspace=torch.empty(8)),
                 lambda: ring_reduce_scatter(torch.ones(4), workspace="pool")):
        with pytest.raises(ValueError, match=r"workspace must be a distlab.collectives.Workspace or None, "
                                             r"got a (Tensor|str); create one with Workspace\(\)"):
            call()
