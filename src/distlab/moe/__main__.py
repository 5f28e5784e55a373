"""`python -m distlab.moe`: check expert parallelism against the reference and report its traffic.

On this machine it starts its own ranks (`--world-size 2 4`); on a GPU node, one rank per GPU:

    torchrun --nproc-per-node 4 -m distlab.moe --tokens 4096 --d-model 1024

Every rank checks outputs and gradients against the single-process layer (float64, small shapes), then
runs a few training steps of a layer of the given size and prints, on rank 0, the bytes its dispatch
all-to-all sent against the balanced-routing prediction `cost_model.predict_all_to_all`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

from distlab import launch
from distlab.cli_types import positive_int
from distlab.moe.gating import check_moe_config
from distlab.moe.parity import ParityCase, expert_parallel_parity
from distlab.moe.traffic import measure_traffic

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def collect(args: argparse.Namespace) -> dict:
    """Run on every rank: the parity verdict (uneven token counts per rank) and every rank's bytes."""
    p = dist.get_world_size()
    sizes = [5 + 3 * i for i in range(p)]
    parity = expert_parallel_parity([ParityCase(sizes, args.experts, args.k, args.capacity_factor,
                                                seed=args.seed)])[0]
    passed = [None] * p
    dist.all_gather_object(passed, parity.passed)
    rows = measure_traffic(args.tokens, args.d_model, 2 * args.d_model, args.experts, args.k,
                           args.capacity_factor, args.skew, args.steps, seed=args.seed,
                           dtype=DTYPES[args.dtype])
    sent = [None] * p
    dist.all_gather_object(sent, [row.dispatch_bytes for row in rows])
    return {"world_size": p, "backend": str(dist.get_backend()), "experts": args.experts, "k": args.k,
            "capacity_factor": args.capacity_factor, "parity_passed_on_every_rank": all(passed),
            "verdict": parity.verdict(), "predicted_dispatch_bytes": rows[0].predicted_bytes,
            "dispatch_bytes_per_rank_per_step": sent}


def report(args: argparse.Namespace) -> str:
    """Run on every rank; the text report."""
    return describe(collect(args))


def describe(data: dict) -> str:
    """The collected data as text."""
    lines = [f"{data['world_size']} ranks ({data['backend']}), {data['experts']} experts, k={data['k']}, "
             f"capacity factor {data['capacity_factor']:g}",
             f"parity with the single-process layer (float64): "
             f"{'ok on every rank' if data['parity_passed_on_every_rank'] else 'FAILED'}",
             f"dispatch all-to-all, bytes sent per rank per step (predicted "
             f"{data['predicted_dispatch_bytes']:,.0f}):"]
    for q, per_step in enumerate(data["dispatch_bytes_per_rank_per_step"]):
        lines.append(f"  rank {q}: " + ", ".join(f"{b:,}" for b in per_step))
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The options, each with its default in the help."""
    p = argparse.ArgumentParser(prog="python -m distlab.moe", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--world-size", type=positive_int, nargs="+", default=[2], metavar="N",
                   help="expert-parallel sizes to run, one launch each (ignored under torchrun); each must "
                        "divide --experts")
    p.add_argument("--experts", type=int, default=8, help="experts E")
    p.add_argument("--k", type=int, default=2, help="experts per token")
    p.add_argument("--capacity-factor", type=float, default=1.25, help="capacity over the even share")
    p.add_argument("--tokens", type=positive_int, default=256, help="tokens per rank in the traffic run")
    p.add_argument("--d-model", type=positive_int, default=64,
                   help="token width (the experts' hidden is twice it)")
    p.add_argument("--skew", type=float, default=0.0, help="strength of the direction all tokens share")
    p.add_argument("--steps", type=positive_int, default=3, help="training steps in the traffic run")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="dtype of the traffic run")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the tokens")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def validate(p: argparse.ArgumentParser, args: argparse.Namespace, sizes: Sequence[int]) -> None:
    """A usage error (`parser.error`, exit status 2) for any value the run cannot take."""
    if not (math.isfinite(args.skew) and args.skew >= 0):
        p.error(f"argument --skew: {args.skew} must be >= 0 (0 = no shared direction)")
    for n in sizes:
        try:
            check_moe_config(args.experts, args.k, args.capacity_factor, n)
        except ValueError as e:
            p.error(str(e))


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Parse the arguments; under torchrun every rank works and rank 0 prints, else start the ranks."""
    p = parser()
    args = p.parse_args(argv)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    validate(p, args, [int(os.environ["WORLD_SIZE"])] if torchrun else args.world_size)
    if torchrun:
        out = [launch.under_torchrun(collect, args)]
    else:
        out = [launch.run(collect, n, args)[0] for n in args.world_size]
    if not torchrun or int(os.environ["RANK"]) == 0:
        print(json.dumps(out, indent=1) if args.json else "\n".join(describe(d) for d in out), flush=True)
    return out


if __name__ == "__main__":
    main()
