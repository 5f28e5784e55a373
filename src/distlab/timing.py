"""The course's one timing loop: ours and the built-in, timed side by side in the same run.

Benchmarks in this course compare against the built-in in the same run and report ratios, never a
time measured on its own: on a shared machine the load changes from minute to minute, and only what
was timed under the same load compares. `time_interleaved` runs inside every rank of `group`:

- warm-up: `warmup` untimed calls of each contender, one after the other (allocations, first-call
  costs, DDP's bucket rebuild after its first step);
- `rounds` rounds; in each, every contender runs one block of `per_block` calls, after a barrier, and
  who goes first rotates from round to round (round k starts with contender k mod n), so that a burst
  of load hits each contender alike;
- a block's time per call is the slowest rank's (a collective, or a step, is done when every rank is
  done), or the mean over ranks as nccl-tests' `-a 1` does; one all-reduce after the last round.

It returns every block's time, `times[round, j]`: the caller takes medians over the rounds, and ratios
of two contenders either of the medians or round by round (both timed within one round, under the same
load). The collectives' benchmark (`collectives.measure`), data parallelism's (`data_parallel.bench`)
and ZeRO's (`memory.bench`) use it.

Where there is no built-in to interleave with (a copy's bandwidth, one layer's step, a kernel's time),
`sample_seconds` is the one loop for a single contender: `warmup` untimed calls, then each of `repeats`
calls timed on its own (after a barrier on ranks; the slowest rank's time, or this rank's), with any
CUDA work synchronised inside the timing; `median_seconds` is their median. `phase_seconds` times the
phases of one step apart (a forward, then the backward of what it returned).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from distlab import launch

OVER_RANKS = ("max", "mean")


def check_timing(per_block: int, rounds: int, warmup: int, over_ranks: str = "max") -> None:
    """Raise a ValueError naming the first bad setting of `time_interleaved` and what to pass instead."""
    for name, value, least in (("per_block", per_block, 1), ("rounds", rounds, 1), ("warmup", warmup, 0)):
        _check_count(name, value, least)
    _check_over_ranks(over_ranks)


def _check_count(name: str, value: int, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}={value!r} must be an integer >= {least}, e.g. {name}={least + 2}")


def _check_over_ranks(over_ranks: str) -> None:
    if over_ranks not in OVER_RANKS:
        raise ValueError(f"over_ranks={over_ranks!r} is unknown; choose 'max' (the slowest rank) or 'mean'")


def time_interleaved(calls: Sequence[Callable[[], object]], per_block: int, rounds: int, *, warmup: int,
                     group: dist.ProcessGroup | None = None, over_ranks: str = "max",
                     device: torch.device | None = None) -> torch.Tensor:
    """Inside every rank of `group`: `times[round, j]`, seconds per call of `calls[j]` in its block of
    `per_block` calls in round `round`, the slowest rank's (`over_ranks="max"`) or the mean over ranks
    (see the module docstring). `device`: the contenders' device, synchronised around each block (a
    GPU's work is asynchronous) and where the times are reduced (default `launch.device()`). Every
    rank returns the same float64 tensor, on the CPU."""
    check_timing(per_block, rounds, warmup, over_ranks)
    dev = device if device is not None else launch.device()
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    for call in calls:
        for _ in range(warmup):
            call()
    sync()
    times = torch.zeros(rounds, len(calls), dtype=torch.float64)
    for k in range(rounds):
        for i in range(len(calls)):
            j = (i + k) % len(calls)  # rotate who goes first
            dist.barrier(group=group)
            sync()
            t0 = time.perf_counter()
            for _ in range(per_block):
                calls[j]()
            sync()
            times[k, j] = (time.perf_counter() - t0) / per_block
    times = times.to(dev)
    dist.all_reduce(times, op=dist.ReduceOp.MAX if over_ranks == "max" else dist.ReduceOp.SUM, group=group)
    return times.cpu() / (1 if over_ranks == "max" else dist.get_world_size(group))


def cuda_sync(device: torch.device | None) -> Callable[[], None] | None:
    """The `sync` of `phase_seconds` for work on `device`: synchronise it if it is a CUDA device."""
    return (lambda: torch.cuda.synchronize(device)) if device is not None and device.type == "cuda" else None


def phase_seconds(phases: Sequence[Callable[[], object]], repeats: int, *, warmup: int = 1,
                  group: dist.ProcessGroup | None = None, barrier: bool = False,
                  over_ranks: str | None = None, sync: Callable[[], object] | None = None,
                  after: Callable[[], object] | None = None) -> list[list[float]]:
    """`times[i][k]`: seconds of phase k in the i-th of `repeats` timed steps, each step running
    `phases` one after the other, after `warmup` untimed steps (the module docstring).

    `barrier`: start each step after a barrier of `group`, when there are ranks (torch.distributed
    initialised and `group` of more than one rank). `over_ranks`: None, this rank's own times; "max" (or
    "mean"), each step's slowest rank (or the mean over ranks), one all-reduce after each timed step.
    `sync`: called before each step and after each phase, inside the timing (a GPU's work is
    asynchronous: `cuda_sync(device)`). `after`: untimed, after every step (warm-up ones too), e.g.
    `zero_grad`."""
    _check_count("repeats", repeats, 1)
    _check_count("warmup", warmup, 0)
    if over_ranks is not None:
        _check_over_ranks(over_ranks)
    ranks = dist.is_initialized() and dist.get_world_size(group) > 1
    times = []
    for i in range(warmup + repeats):
        row = _timed_step(phases, sync or (lambda: None), group if barrier and ranks else _NO_BARRIER)
        if after is not None:
            after()
        if i >= warmup:
            times.append(_over_ranks(row, over_ranks, group) if over_ranks and ranks else row)
    return times


_NO_BARRIER = object()  # for `_timed_step`: start without a barrier (None is the world's group)


def _timed_step(phases: Sequence[Callable[[], object]], sync: Callable[[], object],
                barrier: object) -> list[float]:
    """One step of `phase_seconds`: sync, the barrier of group `barrier` (unless _NO_BARRIER), then each
    phase and a sync; the seconds of each phase."""
    sync()
    if barrier is not _NO_BARRIER:
        dist.barrier(group=barrier)  # type: ignore[arg-type]
    marks = [time.perf_counter()]
    for phase in phases:
        phase()
        sync()
        marks.append(time.perf_counter())
    return [b - a for a, b in itertools.pairwise(marks)]


def _over_ranks(row: list[float], over_ranks: str, group: dist.ProcessGroup | None) -> list[float]:
    t = torch.tensor(row, device=launch.device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX if over_ranks == "max" else dist.ReduceOp.SUM, group=group)
    return (t.cpu() / (1 if over_ranks == "max" else dist.get_world_size(group))).tolist()


def sample_seconds(fn: Callable[[], object], repeats: int, *, warmup: int = 1,
                   group: dist.ProcessGroup | None = None, barrier: bool = False,
                   over_ranks: str | None = None, sync: Callable[[], object] | None = None,
                   after: Callable[[], object] | None = None) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after `warmup` untimed calls: `phase_seconds` of one
    phase (see it for the options)."""
    return [row[0] for row in phase_seconds([fn], repeats, warmup=warmup, group=group, barrier=barrier,
                                            over_ranks=over_ranks, sync=sync, after=after)]


def median_seconds(fn: Callable[[], object], repeats: int, **options: object) -> float:
    """The median of `sample_seconds(fn, repeats, **options)`."""
    return statistics.median(sample_seconds(fn, repeats, **options))  # type: ignore[arg-type]
