"""`python -m distlab.moe`: check expert parallelism against the reference and report its traffic.

On this machine it starts its own ranks (`--world-size 2 4`); on a GPU node, one rank per GPU:

    torchrun --nproc-per-node 4 -m distlab.moe --tokens 4096 --d-model 1024

Every rank checks outputs and gradients against the single-process layer (float64, small shapes), then
measures a few float32 training steps of a layer of the given size and prints, on rank 0, the bytes its
dispatch all-to-all sent against the balanced-routing prediction `cost.predict_all_to_all`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch.distributed as dist

from distlab import launch
from distlab.moe.check import ParityCase, expert_parallel_parity
from distlab.moe.traffic import measure_traffic


def report(args: argparse.Namespace, echo: bool = False) -> str:
    """Run on every rank; returns the text report, which rank 0 also prints when `echo` (torchrun)."""
    p, r = dist.get_world_size(), dist.get_rank()
    sizes = [5 + 3 * i for i in range(p)]  # uneven token counts per rank
    cases = [ParityCase(sizes, args.experts, args.k, args.capacity_factor)]
    parity = expert_parallel_parity(cases)[0]
    worst = parity.worst()
    flags = [worst, float(parity.same_routing)]
    gathered = [None] * p
    dist.all_gather_object(gathered, flags)
    rows = measure_traffic(args.tokens, args.d_model, 2 * args.d_model, args.experts, args.k,
                           args.capacity_factor, args.skew, args.steps)
    sent = [row.dispatch_bytes for row in rows]
    all_sent = [None] * p
    dist.all_gather_object(all_sent, sent)
    lines = [f"{p} ranks ({dist.get_backend()}), {args.experts} experts, k={args.k}, capacity factor "
             f"{args.capacity_factor:g}",
             f"parity with the single-process layer: worst |difference| {max(g[0] for g in gathered):.2e} "
             f"(float64), same routing on every rank: {all(g[1] for g in gathered)}",
             f"dispatch all-to-all, bytes sent per rank per step (predicted {rows[0].predicted_bytes:,.0f}):"]
    for q, per_step in enumerate(all_sent):
        lines.append(f"  rank {q}: " + ", ".join(f"{b:,}" for b in per_step))
    text = "\n".join(lines)
    if echo and r == 0:
        print(text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m distlab.moe", description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, nargs="+", default=[2],
                        help="ranks (without torchrun); each must divide --experts")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--capacity-factor", type=float, default=1.25)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank in the traffic run")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--skew", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "MASTER_ADDR" in os.environ):
        launch.under_torchrun(report, args, echo=True)
        return
    for p in args.world_size:
        print(launch.run(report, p, args)[0])


if __name__ == "__main__":
    main()
