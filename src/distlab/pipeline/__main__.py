"""Run, check and time one pipelined training step of an MLP.

On a laptop (ranks are processes on gloo):
    python -m distlab.pipeline --world-size 4 --schedule 1f1b -m 8
On a GPU node (one rank per GPU, NCCL):
    torchrun --nproc-per-node 4 -m distlab.pipeline --schedule 1f1b -m 8

Every rank builds the same MLP, runs the schedule (the last of --repeats steps is timed), and compares
its gradients with single-process training; rank 0 prints the largest difference, the measured bubble
and the formula's, and each rank's peak stash.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def _worker(schedule: str, m: int, v: int, sizes: list[int], batch: int, repeats: int) -> str | None:
    import torch
    import torch.distributed as dist

    from distlab import launch
    from distlab.models import regression_data
    from distlab.pipeline.schedules import bubble_fraction
    from distlab.pipeline.simulate import timeline_stats
    from distlab.pipeline.train import reference_step, steps_on_rank

    p, rank = dist.get_world_size(), dist.get_rank()
    X, y = regression_data(batch, sizes[0], sizes[-1], seed=0)
    first, *_, last = steps_on_rank([(schedule, m, v)] * repeats, sizes, X, y)
    ref_grads, _ = reference_step(sizes, X, y)
    err = torch.tensor(max(float((g - ref_grads[k]).abs().max()) for k, g in first.grads.items()),
                       device=launch.device())  # NCCL reduces only GPU tensors
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    gathered: list = [None] * p
    dist.all_gather_object(gathered, (last.run.events, last.run.peak_stash, last.run.peak_stash_bytes))
    if rank != 0:
        return None
    events = [e for ev, _, _ in gathered for e in ev]
    stats = timeline_stats(events, p)
    stash = ", ".join(f"r{r}: {n} ({b / 1024:.0f} KiB)" for r, (_, n, b) in enumerate(gathered))
    return (f"{schedule} p={p} m={m} v={v}: max |grad - single-process grad| = {float(err):.1e}\n"
            f"step {stats.makespan * 1e3:.1f} ms, measured bubble {stats.mean_bubble:.1%}, "
            f"formula (p-1)/(v m+p-1) = {bubble_fraction(p, m, v):.1%}\npeak stash {stash}")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m distlab.pipeline", description=__doc__.split("\n")[0])
    parser.add_argument("--schedule", default="1f1b", choices=["naive", "gpipe", "1f1b", "interleaved"])
    parser.add_argument("-m", type=int, default=8, help="microbatches (default 8)")
    parser.add_argument("-v", type=int, default=1, help="model chunks per rank, interleaved only (default 1)")
    parser.add_argument("--sizes", default="64,256,256,256,256,256,256,256,256,8",
                        help="MLP widths, comma-separated")
    parser.add_argument("--batch", type=int, default=64, help="batch size (a multiple of -m)")
    parser.add_argument("--repeats", type=int, default=2, help="steps to run; the last is timed")
    parser.add_argument("--world-size", type=int, default=2, help="ranks to start when not under torchrun")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    work = (args.schedule, args.m, args.v, sizes, args.batch, max(1, args.repeats))
    from distlab import launch
    from distlab.pipeline.schedules import make_schedule

    try:  # bad arguments fail here, before any rank starts
        make_schedule(args.schedule, int(os.environ.get("WORLD_SIZE", args.world_size)), args.m, args.v)
    except ValueError as e:
        parser.error(str(e))
    if "RANK" in os.environ:  # started by torchrun
        out = launch.under_torchrun(_worker, *work)
        if out:
            print(out)
        return 0
    print(launch.run(_worker, args.world_size, *work)[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
