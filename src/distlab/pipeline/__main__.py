"""Run, check and time one pipelined training step of an MLP.

On a laptop (ranks are processes on gloo):
    python -m distlab.pipeline --world-size 4 --schedule 1f1b -m 8
On a GPU node (one rank per GPU, NCCL):
    torchrun --nproc-per-node 4 -m distlab.pipeline --schedule 1f1b -m 8

Every rank builds the same MLP, runs the schedule (the last of --steps steps is timed), and rank 0
checks the first step against single-process training (loss, gradients, updated weights within 1e-6),
then prints the measured bubble beside the formula's and each rank's peak stash.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

WHY_MEASURED_IS_LARGER = {
    "gloo": "Why the measured bubble is larger: the formula counts only the pipeline's fill and drain, "
            "while here the ranks share the CPU's cores and the operating system decides which one runs, "
            "every message costs a copy the formula takes as free, and the executor's Python runs between "
            "actions.",
    "nccl": "Why the measured bubble is larger: the formula takes transfers as free and counts no time "
            "between kernels, where the executor's Python and the synchronisations for timing run."}


def _worker(schedule: str, m: int, v: int, sizes: list[int], batch: int, steps: int,
            seed: int) -> tuple[bool, str] | None:
    import torch.distributed as dist

    from distlab.models import regression_data
    from distlab.pipeline.cost_model import bubble_fraction, zero_bubble_fraction
    from distlab.pipeline.parity import merge, step_parity
    from distlab.pipeline.simulate import timeline_stats
    from distlab.pipeline.train import reference_step, steps_on_rank

    p, rank = dist.get_world_size(), dist.get_rank()
    X, y = regression_data(batch, sizes[0], sizes[-1], seed=seed)
    results = steps_on_rank([(schedule, m, v)] * steps, sizes, X, y, seed=seed)
    first, last = results[0], results[-1]
    gathered: list = [None] * p
    dist.all_gather_object(gathered, (first, last.run.events, last.run.peak_stash, last.run.peak_stash_bytes))
    if rank != 0:
        return None
    parity = step_parity(merge([g[0] for g in gathered]), reference_step(sizes, X, y, seed=seed))
    stats = timeline_stats([e for g in gathered for e in g[1]], p)
    stash = ", ".join(f"r{r}: {g[2]} ({g[3] / 1024:.0f} KiB)" for r, g in enumerate(gathered))
    return parity.passed, (f"{schedule} p={p} m={m} v={v}: {parity.verdict()}\n"
                       f"step {stats.makespan * 1e3:.1f} ms, measured bubble {stats.mean_bubble:.1%}, "
                       f"{_formula(schedule, p, m, v, bubble_fraction, zero_bubble_fraction)}\n"
                       f"{WHY_MEASURED_IS_LARGER[dist.get_backend()]}\npeak stash {stash}")


def _formula(schedule: str, p: int, m: int, v: int, bubble_fraction, zero_bubble_fraction) -> str:
    if schedule not in ("zbh1", "zbv"):
        return f"formula (p-1)/(v m+p-1) = {bubble_fraction(p, m, v):.1%}"
    try:
        return f"formula with t_f = t_b = t_w: {zero_bubble_fraction(schedule, p, m):.1%}"
    except ValueError as e:  # no closed form for these sizes
        return str(e)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m distlab.pipeline", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--schedule", default="1f1b",
                        choices=["naive", "gpipe", "1f1b", "interleaved", "zbh1", "zbv"],
                        help="the pipeline schedule")
    parser.add_argument("-m", type=int, default=8, help="microbatches (naive: 1)")
    parser.add_argument("-v", type=int, default=1, help="model chunks per rank (interleaved; zbv: 2)")
    parser.add_argument("--sizes", default="64,256,256,256,256,256,256,256,256,8",
                        help="the MLP's widths, comma-separated, input first")
    parser.add_argument("--batch", type=int, default=64, help="batch size (a multiple of -m)")
    parser.add_argument("--steps", type=int, default=2, help="training steps to run; the last is timed")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model's weights and the data")
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks to start on this machine (ignored under torchrun, which sets the world)")
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace, p: int) -> list[int]:
    """Every argument, checked before a rank starts: parser.error (usage and exit 2) on a bad one."""
    import torch

    from distlab.models import MLP
    from distlab.pipeline.partition import balanced_boundaries, parameter_costs
    from distlab.pipeline.schedules import make_schedule
    from distlab.pipeline.train import split_microbatches

    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r} must be integers separated by commas, e.g. 64,256,8")
    if len(sizes) < 2 or min(sizes) < 1:
        parser.error(f"--sizes {args.sizes!r} needs at least two positive widths (input and output), "
                     "e.g. 64,256,8")
    if not 1 <= p <= 64:
        parser.error(f"--world-size {p} must be between 1 and 64 (the number of ranks to start)")
    if args.steps < 1:
        parser.error(f"--steps {args.steps} must be at least 1 (the last step is the one timed)")
    try:
        schedule = make_schedule(args.schedule, p, args.m, args.v)
        if args.batch < 1:
            raise ValueError(f"--batch {args.batch}: a step needs samples to train on; use --batch {args.m} "
                             f"or another multiple of -m {args.m}")
        split_microbatches(torch.empty(args.batch, 0), torch.empty(args.batch, 0), args.m)
        balanced_boundaries(parameter_costs(MLP(sizes).layers), schedule.num_stages)
    except ValueError as e:
        parser.error(str(e))
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; see the module docstring. Returns 0 when the step equals single-process training."""
    parser = _parser()
    args = parser.parse_args(argv)
    under_torchrun = "RANK" in os.environ
    p = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.world_size
    sizes = _check(parser, args, p)
    work = (args.schedule, args.m, args.v, sizes, args.batch, args.steps, args.seed)
    from distlab import launch

    out = launch.under_torchrun(_worker, *work) if under_torchrun else launch.run(_worker, p, *work)[0]
    if out is None:  # a rank other than 0 under torchrun
        return 0
    ok, text = out
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
