"""Command line: the data-parallel benchmark, ours against DDP, started here or by torchrun.

    python -m distlab.data_parallel --world-size 1 2 3 4
    torchrun --nproc-per-node 4 -m distlab.data_parallel --batch 64 --rounds 5

Without torchrun it starts each world size of `--world-size` with `distlab.launch` (one launch each); under
torchrun the world is torchrun's, every rank measures and rank 0 prints. See `bench` for what is timed.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

from distlab import launch
from distlab.cli_types import positive_int
from distlab.data_parallel.bench import (
    ALL_STRATEGIES,
    BENCH_BUCKET_BYTES,
    Result,
    benchmark,
    check_settings,
    format_results,
    measure,
    ratio_to_ddp,
)


def parser() -> argparse.ArgumentParser:
    """The options, each with its default in the help."""
    parser = argparse.ArgumentParser(prog="python -m distlab.data_parallel",
                                     description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--world-size", type=positive_int, nargs="+", default=[1, 2],
                        help="ranks to start, one launch per value (under torchrun the world is torchrun's)")
    parser.add_argument("--strategies", nargs="+", default=list(ALL_STRATEGIES), choices=ALL_STRATEGIES,
                        help="what to time; 'compute' is the step without communication")
    parser.add_argument("--batch", type=positive_int, default=2, help="sequences per rank per step")
    parser.add_argument("--steps", type=positive_int, default=5, help="steps per timed block")
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed blocks per strategy (median)")
    parser.add_argument("--bucket-bytes", type=positive_int, default=BENCH_BUCKET_BYTES,
                        help="bucket cap in bytes, for ours and for DDP")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    return parser


def _report(results: list[Result], as_json: bool) -> None:
    if as_json:
        print(json.dumps([{"strategy": r.strategy, "world_size": r.world_size,
                           "per_rank_batch": r.per_rank_batch, "step_seconds": r.step_seconds,
                           "samples_per_second": r.samples_per_second,
                           "hidden_fraction": r.timeline.hidden_fraction if r.timeline else None}
                          for r in results], indent=1))
        return
    print(format_results(results))
    print("overlapped / ddp throughput:", {p: round(v, 3) for p, v in ratio_to_ddp(results).items()})


def _under_torchrun(args: argparse.Namespace) -> list[Result]:
    results = measure(args.strategies, args.batch, args.steps, args.rounds, args.bucket_bytes, threads=None)
    if launch.rank() == 0:
        _report(results, args.json)
    return results


def main(argv: Sequence[str] | None = None) -> list[Result]:
    """Parse the options (a bad value exits with argparse's usage error), then measure and print."""
    cli = parser()
    args = cli.parse_args(argv)
    try:
        check_settings(args.strategies, args.batch, args.steps, args.rounds, args.bucket_bytes)
    except ValueError as e:
        cli.error(str(e))
    if max(args.world_size) > 64:
        cli.error(f"--world-size {max(args.world_size)} starts that many processes on this machine; "
                     "use at most 64 (2 to 8 on a CPU), or torchrun on a GPU node")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return launch.under_torchrun(_under_torchrun, args)
    results = benchmark(args.world_size, args.strategies, args.batch, args.steps, args.rounds,
                        args.bucket_bytes)
    _report(results, args.json)
    return results


if __name__ == "__main__":
    main()
