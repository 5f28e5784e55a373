"""Command line: train the course's GPT for a few steps on a dp x pp x tp mesh and check it.

    python -m distlab.parallel3d --dp 2 --pp 2 --tp 1            # 4 ranks as CPU processes (gloo)
    python -m distlab.parallel3d --dp 1 --pp 2 --tp 2 --sequence-parallel --zero-stage 2 --json

The world size is dp x pp x tp (`--world-size`, if given, must equal it). Every rank trains its shard;
the parent process trains the dense GPT on the same seed and batches, compares losses, first-step
gradients and final parameters shard by shard (`parity.parity_3d`), and compares the bytes each rank
recorded per mesh dim with `cost_model.predicted_traffic`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from distlab import launch
from distlab.cli_types import DTYPES, add_dtype, add_json, add_seed, add_steps, add_world_size, positive_int
from distlab.models import GPTConfig
from distlab.parallel3d.config import SCHEDULES_3D, ZERO_STAGES_3D, Plan3D, check_plan
from distlab.parallel3d.cost_model import bytes_by_axis, predicted_traffic
from distlab.parallel3d.parity import parity_3d, reference_run
from distlab.parallel3d.train import RankRun3D, make_batches, train_3d


def _config(args: argparse.Namespace) -> GPTConfig:
    return GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads,
                     n_embd=args.hidden)


def _plan(args: argparse.Namespace) -> Plan3D:
    return Plan3D(args.dp, args.pp, args.tp, args.micro_batches, args.schedule, args.zero_stage,
                  args.sequence_parallel)


def _rank(args: argparse.Namespace) -> RankRun3D:
    plan = _plan(args)
    mesh = plan.layout.mesh()
    batches = make_batches(_config(args), args.batch, args.seq, args.steps, args.seed)
    return train_3d(mesh, _config(args), plan, batches, seed=args.seed, dtype=DTYPES[args.dtype],
                    device=launch.device())


def summarize(runs: list[RankRun3D], args: argparse.Namespace) -> dict:
    """The parity verdict and, per rank, the bytes sent per dim: recorded and predicted."""
    config, plan, dtype = _config(args), _plan(args), DTYPES[args.dtype]
    batches = make_batches(config, args.batch, args.seq, args.steps, args.seed)
    parity = parity_3d(runs, reference_run(config, batches, args.seed, dtype=dtype), config, plan, dtype)
    ranks = []
    for rank, run in enumerate(runs):
        want = predicted_traffic(config, plan, args.batch, args.seq, run.coords["pp"], dtype.itemsize)
        ranks.append({"rank": rank, "coords": run.coords, "bytes_recorded": bytes_by_axis(run.traffic),
                      "bytes_predicted": bytes_by_axis(want),
                      "same_as_predicted": {k: (t.calls, t.sent_bytes) for k, t in run.traffic.items()}
                      == {k: (t.calls, t.sent_bytes) for k, t in want.items()}})
    return {"plan": plan.label(), "passed": parity.passed, "verdict": parity.verdict(), "ranks": ranks}


def describe(summary: dict) -> str:
    lines = [summary["verdict"]]
    for r in summary["ranks"]:
        same = "= predicted" if r["same_as_predicted"] else "DIFFERENT from predicted"
        sent = ", ".join(f"{d} {b / 1e3:.1f} kB" for d, b in r["bytes_recorded"].items())
        lines.append(f"  rank {r['rank']} {r['coords']}: sent {sent} ({same})")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The options, each with its default in the help."""
    p = argparse.ArgumentParser(prog="python -m distlab.parallel3d", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dp", type=positive_int, default=2, help="data-parallel replicas")
    p.add_argument("--pp", type=positive_int, default=2, help="pipeline stages")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks per layer")
    add_world_size(p, None, "if given, must equal dp x pp x tp")
    p.add_argument("--micro-batches", type=positive_int, default=2,
                   help="micro-batches m per step and replica")
    p.add_argument("--schedule", choices=SCHEDULES_3D, default="1f1b", help="pipeline schedule")
    p.add_argument("--zero-stage", type=int, choices=ZERO_STAGES_3D, default=1, help="ZeRO stage over dp")
    p.add_argument("--sequence-parallel", action="store_true", help="split the sequence outside tp regions")
    add_steps(p, 3, "training steps")
    p.add_argument("--batch", type=positive_int, default=8, help="sequences per step (the global batch)")
    p.add_argument("--seq", type=positive_int, default=12, help="tokens per sequence (also the block size)")
    p.add_argument("--hidden", type=positive_int, default=24, help="hidden size n_embd")
    p.add_argument("--heads", type=positive_int, default=12, help="attention heads n_head")
    p.add_argument("--layers", type=positive_int, default=4, help="transformer blocks n_layer")
    p.add_argument("--vocab", type=positive_int, default=24, help="vocabulary size")
    add_dtype(p, "float64", "dtype of both runs")
    add_seed(p, "seed of the weights and the batches")
    add_json(p)
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    """Parse, check every value before starting a rank (usage errors, exit status 2), run, report."""
    p = parser()
    args = p.parse_args(argv)
    if args.hidden % args.heads:
        p.error(f"argument --hidden: {args.hidden} is not divisible by --heads {args.heads}")
    try:
        check_plan(_plan(args), _config(args), args.batch, args.seq, args.world_size)
    except ValueError as e:
        p.error(str(e))
    runs = launch.run(_rank, _plan(args).world_size, args)
    out = summarize(runs, args)
    print(json.dumps(out, indent=1) if args.json else describe(out), flush=True)
    return out


if __name__ == "__main__":
    main()
