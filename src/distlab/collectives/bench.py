"""An nccl-tests-style benchmark: our collectives against torch.distributed's built-ins.

For each message size, every implementation of a collective (ours from `ALGORITHMS`, and the built-in,
named "torch") is warmed up, then timed in blocks of `iters` calls with a barrier before each block;
the blocks of the implementations are interleaved, in rotating order, so that machine noise hits them
alike. Each rank times its own block; the time of a block is the slowest rank's (max over ranks; nccl-tests
averages over ranks by default, `-a 1`, and takes the max with `-a 3`) and a row reports the median
over `repeats` blocks. Sizes, algbw and busbw follow nccl-tests' doc/PERFORMANCE.md (NVIDIA, 2016-):
the size is that of the whole vector (see `busbw_factor`), algbw = size / time and busbw = algbw x factor;
`busbw` holds those conventions, the `Row` this benchmark fills and the tables that print the rows;
`measure` holds the timing loop that runs inside every rank; this file starts the ranks.

    from distlab.collectives import bench
    rows = bench.benchmark(4, ["all_reduce"], bench.parse_sizes("4M:64M:4"))
    print(bench.format_table(rows)); print(bench.format_ratio_table(bench.ratio_table(rows)))

On a GPU node, the same benchmark runs under torchrun, one GPU per rank, on NCCL:

    torchrun --nproc-per-node 4 -m distlab.collectives.bench --sizes 1K:256M --collectives all_reduce
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from distlab import launch
from distlab.collectives.busbw import BUILTIN as BUILTIN
from distlab.collectives.busbw import (
    COLLECTIVES,
    Row,
    format_ratio_table,
    format_table,
    parse_sizes,
    ratio_table,
)
from distlab.collectives.busbw import busbw_factor as busbw_factor
from distlab.collectives.measure import _DTYPES as _DTYPES
from distlab.collectives.measure import _check_choice as _check_choice
from distlab.collectives.measure import _check_counts as _check_counts
from distlab.collectives.measure import _check_sizes as _check_sizes
from distlab.collectives.measure import _element_count as _element_count
from distlab.collectives.measure import _pick as _pick
from distlab.collectives.measure import implementations_of as implementations_of
from distlab.collectives.measure import run_benchmark as run_benchmark

# --------------------------------------------------------------------------------------------------
# The driver, in the parent process
# --------------------------------------------------------------------------------------------------

def benchmark(world_size: int | Sequence[int], collectives: Sequence[str] = ("all_reduce",),
              sizes: Sequence[int] | str = "4M:64M:4", implementations: Sequence[str] | None = None, *,
              iters: int | None = None, warmup: int | None = None, repeats: int = 5, dtype: str = "float32",
              ranks_per_node: int | None = None, over_ranks: str = "max", backend: str = "auto",
              timeout: float = 120.0, progress: bool = True) -> list[Row]:
    """Start `world_size` ranks (or one run per world size in a list) with `launch.run` and benchmark.

    Arguments as for `run_benchmark`. A tqdm bar advances after each (collective, size). Returns the rows
    of all runs; `format_table(rows)` prints them, `ratio_table(rows)` compares ours with the built-in.
    """
    sizes = parse_sizes(sizes) if isinstance(sizes, str) else _check_sizes(sizes)
    world_sizes = [world_size] if isinstance(world_size, int) else list(world_size)
    for w in world_sizes:
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"world_size={w!r} must be a positive integer number of ranks, e.g. 2 or [2, 4]")
    if isinstance(collectives, str):
        collectives = [collectives]
    for c in collectives:
        _pick(c, implementations)  # raises on unknown collectives and implementations
    _check_counts(iters, warmup, repeats)
    _check_choice("dtype", dtype, _DTYPES)
    _check_choice("over_ranks", over_ranks, ("max", "mean"))
    itemsize = torch.tensor([], dtype=_DTYPES[dtype]).element_size()
    for w in world_sizes:
        for c in collectives:
            for s in sizes:
                _element_count(c, s, itemsize, w)
    from tqdm.auto import tqdm

    rows: list[Row] = []
    total = len(world_sizes) * len(collectives) * len(sizes)
    with tempfile.TemporaryDirectory(prefix="distlab-bench-") as tmp, \
            tqdm(total=total, desc="benchmark", unit="size", disable=not progress) as bar:
        for i, w in enumerate(world_sizes):
            path = Path(tmp) / f"progress-{i}"
            path.touch()
            bar.set_postfix_str(f"{w} ranks")
            done = threading.Event()
            watcher = threading.Thread(target=_follow, args=(path, bar, done), daemon=True)
            watcher.start()
            try:
                rows += launch.run(run_benchmark, w, list(collectives), sizes, implementations, iters=iters,
                                   warmup=warmup, repeats=repeats, dtype=dtype, ranks_per_node=ranks_per_node,
                                   over_ranks=over_ranks, progress_path=str(path), backend=backend,
                                   timeout=timeout)[0]
            finally:
                done.set()
                watcher.join()
    return rows


def _follow(path: Path, bar: Any, done: threading.Event) -> None:
    """Advance `bar` by one for every line rank 0 appends to `path`, until `done`."""
    seen = 0
    while True:
        finished = done.wait(0.2)
        lines = path.read_text().count("\n") if path.exists() else 0
        if lines > seen:
            bar.update(lines - seen)
            seen = lines
        if finished:
            return


# --------------------------------------------------------------------------------------------------
# Command line: under torchrun (one GPU per rank), or starting its own ranks on this machine
# --------------------------------------------------------------------------------------------------

def _under_torchrun(args: argparse.Namespace) -> list[Row]:
    rows = run_benchmark(args.collectives, parse_sizes(args.sizes), args.implementations, iters=args.iters,
                         warmup=args.warmup, repeats=args.repeats, dtype=args.dtype,
                         ranks_per_node=args.ranks_per_node, over_ranks=args.over_ranks, echo=True)
    if launch.rank() == 0:
        print("\n" + format_ratio_table(ratio_table(rows)), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Command line: under torchrun, every rank measures and rank 0 prints; otherwise start the ranks.

    Returns the rows (on every rank under torchrun).
    """
    parser = argparse.ArgumentParser(prog="python -m distlab.collectives.bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4M:64M:4", help="MIN:MAX[:FACTOR] or a comma list, e.g. 1K:256M")
    parser.add_argument("--collectives", nargs="+", default=["all_reduce"], choices=COLLECTIVES)
    parser.add_argument("--implementations", nargs="+", default=None, help="default: ours and torch")
    parser.add_argument("--world-size", type=int, nargs="+", default=[2], help="ranks (without torchrun)")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=list(_DTYPES))
    parser.add_argument("--ranks-per-node", type=int, default=None)
    parser.add_argument("--over-ranks", default="max", choices=["max", "mean"])
    args = parser.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return launch.under_torchrun(_under_torchrun, args)
    rows = benchmark(args.world_size, args.collectives, args.sizes, args.implementations, iters=args.iters,
                     warmup=args.warmup, repeats=args.repeats, dtype=args.dtype,
                     ranks_per_node=args.ranks_per_node, over_ranks=args.over_ranks)
    print(format_table(rows))
    print("\n" + format_ratio_table(ratio_table(rows)))
    return rows


if __name__ == "__main__":
    main()
