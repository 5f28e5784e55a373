"""The closed-form predictions of chapter 2: what a data-parallel step costs, from the alpha-beta model.

A step is compute (forward, backward, update) plus the all-reduce of the n bytes of gradients. With the
ring all-reduce of chapter 1 (Patarasuk & Yuan 2009), on p ranks each rank sends 2 (p-1)/p n bytes and
the all-reduce takes 2 (p-1) alpha + 2 (p-1)/p n beta. Bucketing pays alpha once per bucket instead of
once per tensor; overlap hides the all-reduces behind backward, as far as backward lasts (Li et al. 2020,
"PyTorch Distributed", VLDB 13(12), sec. 3.2).

- `predict_step_seconds`: seconds per step on p ranks, without overlap or with perfect overlap;
- `predicted_timeline`: one step as a `StepTimeline` (the same picture the benchmark measures): gradients
  become ready through backward in proportion to their size, each bucket starts when it is full (with
  overlap) or when backward ends (without), and once the previous bucket is done (one link), and lasts a
  ring all-reduce of its bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from distlab.collectives.cost_model import MachineParams, ring_all_reduce_time
from distlab.data_parallel.buckets import check_bucket_bytes
from distlab.data_parallel.timeline import StepTimeline


def predict_step_seconds(p: int, compute_seconds: float, nbytes: int, machine: MachineParams,
                         cores: int | None = None, overlap: bool = False) -> float:
    """Predicted seconds per step on p ranks: compute, plus a ring all-reduce of the gradients
    (2(p-1) alpha + 2 (p-1)/p n beta, chapter 1), or the larger of the two with perfect overlap.

    compute_seconds: one rank's forward + backward + update on one core (or one GPU).
    cores: if given, the ranks share that many cores, so compute slows by p / cores beyond p = cores.
    """
    compute = compute_seconds * (max(1.0, p / cores) if cores else 1.0)
    comm = float(ring_all_reduce_time(nbytes, p, machine))
    return max(compute, comm) if overlap else compute + comm


def predicted_timeline(param_bytes: Sequence[int], backward_seconds: float, bucket_bytes: int, p: int,
                       machine: MachineParams, overlap: bool, strategy: str = "") -> StepTimeline:
    """The alpha-beta prediction of one step's timeline.

    param_bytes: the gradient sizes in the order backward produces them (reverse registration order);
    backward_seconds: the time of backward, spread over the gradients in proportion to their bytes;
    bucket_bytes: cut into buckets as `sync.make_buckets` does (use 1 for one bucket per parameter);
    overlap: launch each bucket when it is full (strategy 3) or all of them after backward (1 and 2).
    """
    check_bucket_bytes(bucket_bytes)
    sizes = [int(b) for b in param_bytes]
    if not sizes or min(sizes) <= 0 or backward_seconds < 0:
        raise ValueError("param_bytes must be non-empty and positive and backward_seconds >= 0; pass "
                         "the gradient sizes in bytes, e.g. [4096, 256, 4096]")
    buckets = _filled_buckets(sizes, backward_seconds, bucket_bytes)
    launch, done, free = [], [], 0.0
    for nbytes, full in buckets:
        start = max(full if overlap else backward_seconds, free)
        free = start + float(ring_all_reduce_time(nbytes, p, machine))
        launch.append(start)
        done.append(free)
    name = strategy or ("overlapped" if overlap else "bucketed")
    return StepTimeline(name, backward_seconds, max(free, backward_seconds), tuple(launch), tuple(done),
                        tuple(b for b, _ in buckets))


def _filled_buckets(sizes: list[int], backward_seconds: float, bucket_bytes: int) -> list[tuple[int, float]]:
    """The buckets as (bytes, time backward has filled it), gradients ready in proportion to their bytes."""
    total = sum(sizes)
    buckets: list[tuple[int, float]] = []
    size, ready = 0, 0.0
    for nbytes in sizes:
        if size and size + nbytes > bucket_bytes:
            buckets.append((size, ready))
            size = 0
        size += nbytes
        ready += backward_seconds * nbytes / total
    buckets.append((size, backward_seconds))
    return buckets
