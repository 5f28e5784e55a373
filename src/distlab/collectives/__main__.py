"""Command line: benchmark our collectives against torch.distributed's built-ins, nccl-tests style.

    python -m distlab.collectives --world-size 2 4                 # ranks as CPU processes (gloo)
    torchrun --nproc-per-node 4 -m distlab.collectives --sizes 1K:256M   # one GPU per rank (NCCL)

Every row is one implementation at one size; the ratio table puts each of ours beside the built-in
(built-in time / our time). See `bench.py` for how the timing works.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

from distlab import launch
from distlab.cli_types import add_json, add_world_size
from distlab.collectives.bench import benchmark, check_arguments
from distlab.collectives.busbw import (
    COLLECTIVES,
    Row,
    format_ratio_table,
    format_table,
    parse_sizes,
    ratio_table,
)
from distlab.collectives.measure import _DTYPES, run_benchmark


def parser() -> argparse.ArgumentParser:
    """The options, each with its default shown in --help."""
    p = argparse.ArgumentParser(prog="python -m distlab.collectives", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", default="4M:64M:4",
                   help="message sizes in bytes: MIN:MAX[:FACTOR] or a comma list, e.g. 1K:256M or 4M,64M")
    p.add_argument("--collectives", nargs="+", default=["all_reduce"], choices=COLLECTIVES, metavar="NAME",
                   help=f"collectives to measure, of {', '.join(COLLECTIVES)}")
    p.add_argument("--implementations", nargs="+", default=None, metavar="NAME",
                   help="names from ALGORITHMS and 'torch' (the built-in); default: all of ours and torch")
    add_world_size(p, [2], "ranks to start, one run per value (ignored under torchrun, which sets the world)",
                   nargs="+")
    p.add_argument("--iters", type=int, default=None,
                   help="calls per timed block; default: 20, fewer for big messages (a block moves ~256 MB)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed calls first; default: min(5, iters)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed blocks per implementation (median taken)")
    p.add_argument("--dtype", default="float32", choices=list(_DTYPES), help="element type")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="node size for hierarchical_all_reduce; default: LOCAL_WORLD_SIZE under torchrun on "
                        "several nodes, else half the ranks when p is even and >= 4, else p")
    p.add_argument("--over-ranks", default="max", choices=["max", "mean"],
                   help="a block's time: the slowest rank's (max) or the mean over ranks (nccl-tests' -a 1)")
    add_json(p, "print the rows as JSON instead of tables")
    return p


def _under_torchrun(args: argparse.Namespace) -> list[Row]:
    rows = run_benchmark(args.collectives, parse_sizes(args.sizes), args.implementations, iters=args.iters,
                         warmup=args.warmup, repeats=args.repeats, dtype=args.dtype,
                         ranks_per_node=args.ranks_per_node, over_ranks=args.over_ranks, echo=not args.json)
    if launch.rank() == 0:
        print(_report(rows, args.json, tables=False), flush=True)
    return rows


def _report(rows: list[Row], as_json: bool, tables: bool = True) -> str:
    if as_json:
        return json.dumps([r.as_dict() for r in rows], indent=1)
    ratios = format_ratio_table(ratio_table(rows))
    return f"{format_table(rows)}\n\n{ratios}" if tables else f"\n{ratios}"


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Parse the arguments (a bad value is a usage error); under torchrun every rank measures and rank 0
    prints, otherwise start the ranks here. Returns the rows (on every rank under torchrun)."""
    cli = parser()
    args = cli.parse_args(argv)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if torchrun else args.world_size
    try:
        check_arguments(world, args.collectives, args.sizes, args.implementations, iters=args.iters,
                        warmup=args.warmup, repeats=args.repeats, dtype=args.dtype,
                        over_ranks=args.over_ranks)
        if args.ranks_per_node is not None and args.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node={args.ranks_per_node} must be >= 1, e.g. --ranks-per-node 2")
    except ValueError as err:
        cli.error(str(err))
    if torchrun:
        return launch.under_torchrun(_under_torchrun, args)
    rows = benchmark(args.world_size, args.collectives, args.sizes, args.implementations, iters=args.iters,
                     warmup=args.warmup, repeats=args.repeats, dtype=args.dtype,
                     ranks_per_node=args.ranks_per_node, over_ranks=args.over_ranks, progress=not args.json)
    print(_report(rows, args.json))
    return rows


if __name__ == "__main__":
    main()
