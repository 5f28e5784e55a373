"""The measurement loop of the benchmark, inside every rank: one call per implementation, timed in blocks.

For each collective and size, `run_benchmark` builds one call per implementation with its buffers
allocated once (ours from `ALGORITHMS`, and the built-in, named "torch"), and times them with the course's
one timing loop (`distlab.timing.time_interleaved`): each warmed up, then in blocks of `iters` calls with a
barrier before each block, interleaved in rotating order so that machine noise hits them alike. The time
of a block is the slowest rank's (or the mean, as nccl-tests' `-a 1`), and a row holds the median over
`repeats` blocks, with algbw and busbw as nccl-tests defines them (`busbw.py`).
`bench.py` starts the ranks that run this, from a notebook or the command line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from distlab import launch
from distlab.collectives.algorithms import ALGORITHMS
from distlab.collectives.busbw import BUILTIN, COLLECTIVES, Row, busbw_factor, format_table
from distlab.collectives.workspace import Workspace
from distlab.dist_compat import all_gather_single, reduce_scatter_single
from distlab.timing import time_interleaved

# Collectives whose size is split evenly over the ranks: nccl-tests rounds the count down to a multiple of p.
_SPLIT = ("reduce_scatter", "all_gather", "all_to_all", "scatter", "gather")
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64}
_CHUNK = 256 << 20  # auto iteration count: each timed block moves about this many bytes


def _check_sizes(sizes: Sequence[int]) -> list[int]:
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes is empty; pass at least one size in bytes, e.g. [4096] or '4K:4M'")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s <= 0:
            raise ValueError(f"size={s!r} in sizes must be a positive integer number of bytes; "
                             "e.g. sizes=[4096, 1 << 20] or parse_sizes('4K:4M')")
    return [int(s) for s in sizes]


# --------------------------------------------------------------------------------------------------
# One call of each implementation, with its buffers allocated once
# --------------------------------------------------------------------------------------------------

def implementations_of(collective: str) -> list[str]:
    """Our algorithms for `collective` (names in ALGORITHMS), then the built-in, "torch"."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}")
    return [name for name, algo in ALGORITHMS.items() if algo.collective == collective] + [BUILTIN]


def _make_call(collective: str, impl: str, count: int, dtype: torch.dtype, ranks_per_node: int,
               group: ProcessGroup | None) -> Callable[[], object]:
    """A zero-argument function that runs one `collective` of `count` elements in all with `impl`, on
    `group` (roots are group rank 0).

    Buffers are allocated once, here. `count` is the whole vector (see `busbw_factor`); a rank's part
    of it is count / p elements.
    """
    p, root, dev = dist.get_world_size(group), dist.get_rank(group) == 0, launch.device()

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=dtype, device=dev)

    whole = zeros(count) if collective in ("all_reduce", "reduce_scatter", "broadcast", "reduce") else None
    part = zeros(count // p) if collective in _SPLIT and collective != "all_to_all" else None
    parts = [zeros(count // p) for _ in range(p)] if collective == "all_to_all" or (
        root and collective in ("scatter", "gather")) else None
    if impl != BUILTIN:
        return _ours(collective, ALGORITHMS[impl], ranks_per_node, whole, part, parts, group)
    return _builtin(collective, count, p, zeros, whole, part, parts, group)


def _ours(collective: str, algo: Any, ranks_per_node: int, whole: Any, part: Any, parts: Any,
          g: ProcessGroup | None) -> Callable[[], object]:
    """One call of our algorithm `algo` on the buffers, with its own `Workspace` kept across the calls
    where it takes one (as a training loop keeps one per gradient bucket)."""
    extra: dict[str, Any] = {"ranks_per_node": ranks_per_node} if "ranks_per_node" in algo.needs else {}
    if algo.workspace:
        extra["workspace"] = Workspace()
    fn = algo.fn
    return {
        "all_reduce": lambda: fn(whole, group=g, **extra),
        "reduce_scatter": lambda: fn(whole, group=g, **extra),
        "all_gather": lambda: fn(part, group=g),
        "broadcast": lambda: fn(whole, src=0, group=g),
        "reduce": lambda: fn(whole, dst=0, group=g),
        "all_to_all": lambda: fn(parts, group=g),
        "scatter": lambda: fn(parts, src=0, group=g),
        "gather": lambda: fn(part, dst=0, group=g),
    }[collective]


def _builtin(collective: str, count: int, p: int, zeros: Callable[[int], torch.Tensor], whole: Any,
             part: Any, parts: Any, g: ProcessGroup | None) -> Callable[[], object]:
    """One call of torch.distributed's own collective on the buffers (with its output buffers)."""
    reduce_scatter, all_gather = reduce_scatter_single, all_gather_single
    out: Any = None  # the built-ins' output buffers
    if collective == "all_gather":
        out = zeros(count)
    elif collective == "reduce_scatter":
        out = zeros(count // p)
    elif collective == "all_to_all":
        out = [torch.empty_like(t) for t in parts]
    return {
        "all_reduce": lambda: dist.all_reduce(whole, group=g),
        "reduce_scatter": lambda: reduce_scatter(out, whole, group=g),
        "all_gather": lambda: all_gather(out, part, group=g),
        "broadcast": lambda: dist.broadcast(whole, group=g, group_src=0),
        "reduce": lambda: dist.reduce(whole, group=g, group_dst=0),
        "all_to_all": lambda: dist.all_to_all(out, parts, group=g),
        "scatter": lambda: dist.scatter(part, parts, group=g, group_src=0),
        "gather": lambda: dist.gather(part, parts, group=g, group_dst=0),
    }[collective]


def _element_count(collective: str, size: int, itemsize: int, p: int) -> int:
    count = size // itemsize
    if collective in _SPLIT:
        count -= count % p  # as nccl-tests: a whole number of elements per rank
    if count < 1 or (collective in _SPLIT and count < p):
        least = itemsize * (p if collective in _SPLIT else 1)
        raise ValueError(f"size={size} B is too small for {collective} on {p} ranks with {itemsize}-byte "
                         f"elements; use sizes of at least {least} B")
    return count


def _auto_iters(size: int, iters: int | None) -> int:
    return iters if iters is not None else int(np.clip(_CHUNK // size, 2, 20))


# --------------------------------------------------------------------------------------------------
# Inside every rank
# --------------------------------------------------------------------------------------------------

def run_benchmark(collectives: Sequence[str], sizes: Sequence[int],
                  implementations: Sequence[str] | None = None, *, iters: int | None = None,
                  warmup: int | None = None, repeats: int = 5,
                  dtype: str = "float32", ranks_per_node: int | None = None, over_ranks: str = "max",
                  progress_path: str | None = None, echo: bool = False,
                  group: ProcessGroup | None = None) -> list[Row]:
    """Inside every rank: time each implementation of each collective at each size; return the rows.

    iters: calls per timed block (default: 20, fewer for big messages so that a block moves ~256 MB, at
        least 2); warmup: untimed calls per implementation and size (default: min(5, iters));
    repeats: timed blocks per implementation; the row has their median.
    over_ranks: "max" (the slowest rank's time) or "mean" (nccl-tests' default) per block.
    ranks_per_node: for hierarchical_all_reduce (default: torchrun's LOCAL_WORLD_SIZE on several nodes;
        on one machine half the ranks if p is even and >= 4, else p).
    progress_path: rank 0 appends a line to this file after each size (the parent's progress bar).
    echo: rank 0 prints each row as it is measured (used under torchrun).
    group: the process group to measure on (None = the whole world); rows count its ranks, and its
        rank 0 is every root and writes the progress lines.
    """
    p, me = dist.get_world_size(group), dist.get_rank(group)
    sizes = _check_sizes(sizes)
    _check_choice("dtype", dtype, _DTYPES)
    _check_choice("over_ranks", over_ranks, ("max", "mean"))
    _check_counts(iters, warmup, repeats)
    torch_dtype = _DTYPES[dtype]
    itemsize = torch.tensor([], dtype=torch_dtype).element_size()
    q = _ranks_per_node(p, ranks_per_node)
    plan = {c: _pick(c, implementations) for c in collectives}
    rows: list[Row] = []
    if echo and me == 0:
        print(format_table([]), flush=True)
    for collective in collectives:
        for size in sizes:
            count = _element_count(collective, size, itemsize, p)
            calls = [_make_call(collective, impl, count, torch_dtype, q, group) for impl in plan[collective]]
            n_iter = _auto_iters(count * itemsize, iters)
            times = time_interleaved(calls, n_iter, repeats, group=group, over_ranks=over_ranks,
                                     warmup=warmup if warmup is not None else min(5, n_iter))
            new = [_row(collective, impl, p, count, itemsize, dtype, float(times[:, j].median()))
                   for j, impl in enumerate(plan[collective])]
            rows += new
            if me == 0:
                _report(new, f"{collective} {size}", echo, progress_path)
            del calls
    return rows


def _ranks_per_node(p: int, ranks_per_node: int | None) -> int:
    """The node size: as given, else torchrun's LOCAL_WORLD_SIZE on several nodes, else half the ranks
    when p is even and >= 4, else p."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", p))
    return ranks_per_node or (local if local < p else p // 2 if p % 2 == 0 and p >= 4 else p)


def _report(new: list[Row], done: str, echo: bool, progress_path: str | None) -> None:
    """Rank 0, after each size: print the rows (echo) and append a line to the progress file."""
    if echo:
        print(format_table(new, header=False), flush=True)
    if progress_path:
        with open(progress_path, "a") as f:
            f.write(f"{done}\n")


def _row(collective: str, impl: str, p: int, count: int, itemsize: int, dtype: str, seconds: float) -> Row:
    size = count * itemsize
    algbw = size / seconds / 1e9
    busbw = algbw * busbw_factor(collective, p)
    return Row(collective, impl, p, size, count, dtype, seconds * 1e6, algbw, busbw)


def _check_counts(iters: int | None, warmup: int | None, repeats: int) -> None:
    for name, value, least in (("iters", iters, 1), ("warmup", warmup, 0), ("repeats", repeats, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{name}={value!r} must be an integer >= {least}, e.g. {name}=5")


def _check_choice(name: str, value: object, allowed: Sequence[str] | dict) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


def _pick(collective: str, implementations: Sequence[str] | None) -> list[str]:
    known = implementations_of(collective)
    if implementations is None:
        return known
    every = {i for c in COLLECTIVES for i in implementations_of(c)}
    for impl in implementations:
        if impl not in every:
            raise ValueError(f"unknown implementation {impl!r}; choose from {', '.join(sorted(every))}")
    chosen = [i for i in implementations if i in known]
    if not chosen:
        raise ValueError(f"none of implementations={list(implementations)!r} implements {collective}; "
                         f"add one of {', '.join(known)}")
    return chosen
