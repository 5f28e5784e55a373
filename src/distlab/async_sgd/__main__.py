"""Command line: one parameter-server run, started here or by torchrun.

    python -m distlab.async_sgd --mode ssp --staleness 2 --workers 3 --straggler 1 --slowdown 4
    torchrun --nproc-per-node 4 -m distlab.async_sgd --mode async --compute-time 0.01

Under torchrun, rank 0 is the server and the other ranks are workers; the server prints the summary.
"""

from __future__ import annotations

import argparse
import math
import os
from collections import Counter
from collections.abc import Sequence

from distlab import launch
from distlab.async_sgd.parameter_server import PSConfig, ServerLog, run_rank
from distlab.async_sgd.ssp import MODES


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
    return PSConfig(mode=args.mode, staleness=staleness, steps=args.steps, lr=args.lr,
                    global_batch=args.global_batch, compute_time=args.compute_time,
                    straggler=args.straggler, slowdown=args.slowdown)


def _under_torchrun(config: PSConfig) -> None:
    log = run_rank(config)
    if isinstance(log, ServerLog):
        print(summary(log), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m distlab.async_sgd", description=__doc__.split("\n")[0])
    parser.add_argument("--mode", default="async", choices=MODES)
    parser.add_argument("--staleness", type=int, default=None, help="SSP threshold s (needed by mode ssp)")
    parser.add_argument("--workers", type=int, default=3, help="workers (without torchrun)")
    parser.add_argument("--steps", type=int, default=30, help="gradients per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--global-batch", type=int, default=48)
    parser.add_argument("--compute-time", type=float, default=0.01, help="seconds per gradient (a sleep)")
    parser.add_argument("--straggler", type=int, default=None, help="the slow worker (1..workers)")
    parser.add_argument("--slowdown", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.mode == "ssp" and args.staleness is None:
        parser.error("--mode ssp needs --staleness S, the number of clocks a worker may run ahead, e.g. 2")
    config = _config(args)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        launch.under_torchrun(_under_torchrun, config, backend="gloo")  # a CPU parameter server
        return
    log = launch.run(run_rank, args.workers + 1, config, backend="gloo")[0]
    print(summary(log))


if __name__ == "__main__":
    main()
