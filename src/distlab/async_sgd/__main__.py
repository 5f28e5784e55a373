"""Command line: one parameter-server run, started here or by torchrun.

    python -m distlab.async_sgd --mode ssp --staleness 2 --world-size 4 --straggler 1 --slowdown 4
    torchrun --nproc-per-node 4 -m distlab.async_sgd --mode async --compute-time 0.01

The world is the server and its workers: rank 0 serves, ranks 1 .. world size - 1 work. Without torchrun,
`--world-size` ranks are started with `distlab.launch`; under torchrun the world is torchrun's. The
server prints the summary.
"""

from __future__ import annotations

import argparse
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from distlab import launch
from distlab.async_sgd.parameter_server import PSConfig, run_rank, validate
from distlab.async_sgd.problem import Problem
from distlab.async_sgd.server import ServerLog
from distlab.async_sgd.ssp import MODES
from distlab.cli_types import add_seed, add_steps, add_world_size, non_negative_int, positive_int


def summary(log: ServerLog) -> str:
    """A few lines on a finished run: updates, final version, staleness histogram, deaths."""
    hist = Counter(u.staleness for u in log.updates)
    t = log.snapshots[-1][1] if log.snapshots else 0.0
    lines = [f"mode={log.config.mode} workers={log.num_workers}: {len(log.updates)} gradients applied, "
             f"final version {log.version}, {t:.2f} s",
             "staleness histogram: " + ", ".join(f"{k}: {v}" for k, v in sorted(hist.items()))]
    lines += [f"worker {d.worker} declared dead at version {d.version} (clock {d.clock})" for d in log.deaths]
    return "\n".join(lines)


def _config(args: argparse.Namespace) -> PSConfig:
    staleness = math.inf if args.staleness is None else args.staleness
    config = PSConfig(mode=args.mode, staleness=staleness, steps=args.steps, lr=args.lr,
                      global_batch=args.global_batch, compute_time=args.compute_time,
                      straggler=args.straggler, slowdown=args.slowdown, problem=Problem(seed=args.seed))
    # a slow straggler must not look dead: give it four of its steps of silence, and at least 2 s
    timeout = max(config.worker_timeout, 4 * config.compute_time * config.slowdown)
    return replace(config, worker_timeout=timeout, timeout=max(config.timeout, 4 * timeout))


def _under_torchrun(config: PSConfig) -> None:
    log = run_rank(config)
    if isinstance(log, ServerLog):
        print(summary(log), flush=True)


def parser() -> argparse.ArgumentParser:
    """The options, each with its default in the help."""
    parser = argparse.ArgumentParser(prog="python -m distlab.async_sgd", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--mode", default="async", choices=MODES, help="consistency mode")
    parser.add_argument("--staleness", type=non_negative_int, default=None,
                        help="SSP threshold s: clocks a worker may run ahead (for --mode ssp only)")
    add_world_size(parser, 4, "ranks to start without torchrun: the server (rank 0) and the workers")
    add_steps(parser, 30, "gradients per worker")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate")
    parser.add_argument("--global-batch", type=positive_int, default=48,
                        help="examples per clock, over all workers")
    parser.add_argument("--compute-time", type=float, default=0.01, help="seconds per gradient (a sleep)")
    parser.add_argument("--straggler", type=positive_int, default=None,
                        help="the slow worker (1 .. world size - 1)")
    parser.add_argument("--slowdown", type=float, default=1.0, help="how many times slower the straggler is")
    add_seed(parser, "seed of the model and the data")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the options (a bad value exits with argparse's usage error), then run and print a summary."""
    cli = parser()
    args = cli.parse_args(argv)
    if args.mode == "ssp" and args.staleness is None:
        cli.error("--mode ssp needs --staleness S, the number of clocks a worker may run ahead, e.g. 2")
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world_size = int(os.environ["WORLD_SIZE"]) if torchrun else args.world_size
    try:
        config = _config(args)
        validate(config, world_size)
    except ValueError as e:
        cli.error(str(e))
    if not torchrun and world_size > 64:
        cli.error(f"--world-size {world_size} starts that many processes on this machine; use at most 64")
    if torchrun:
        launch.under_torchrun(_under_torchrun, config, backend="gloo")  # a CPU parameter server
        return
    log = launch.run(run_rank, world_size, config, backend="gloo", timeout=config.timeout)[0]
    print(summary(log))


if __name__ == "__main__":
    main()
