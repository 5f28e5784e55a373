"""Command line: check ring attention against dense causal attention; print work and bytes per rank.

    python -m distlab.context_parallel --world-size 4 --seq-len 32      # ranks as CPU processes (gloo)
    python -m distlab.context_parallel --world-size 3 --seq-len 23 --pad

Every rank builds the same q, k, v from the seed, runs ring attention on its shard (both layouts unless
--layout names one), forward and backward, and compares output and gradients with the single-process
`F.scaled_dot_product_attention(..., is_causal=True)`. Beside each rank's measured blocks and bytes it
prints the closed forms of `cost_model`. World size 1 runs in this process.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import torch

from distlab import launch
from distlab.context_parallel import cost_model
from distlab.context_parallel.layouts import LAYOUTS, check_seq_len, padded_length
from distlab.context_parallel.parity import CPParityReport, attention_parity, reports_label
from distlab.parity import merge

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def _run(args: argparse.Namespace) -> list[CPParityReport]:
    return [attention_parity(layout, args.seed, args.batch, args.heads, args.seq_len, args.head_dim,
                             DTYPES[args.dtype], pad=args.pad) for layout in args.layouts]


def summarize(reports: list[CPParityReport], args: argparse.Namespace) -> dict:
    """Per rank and layout: blocks and bytes measured beside the formula; and the verdict."""
    p, e = args.world_size, torch.finfo(DTYPES[args.dtype]).bits // 8
    rows = []
    for rep in reports:
        length = padded_length(args.seq_len, p, rep.layout) if args.pad else args.seq_len
        sent = cost_model.bytes_per_rank(p, length, args.batch, args.heads, args.head_dim, e)
        rows.append({"rank": rep.rank, "layout": rep.layout,
                     "blocks": rep.blocks["full"] + rep.blocks["diagonal"],
                     "blocks_formula": cost_model.blocks_per_rank(p, rep.layout)[rep.rank],
                     "bytes_forward": rep.bytes_forward, "bytes_forward_formula": sent["forward"],
                     "bytes_backward": rep.bytes_backward, "bytes_backward_formula": sent["backward"]})
    report = merge(reports, label=reports_label(reports))
    return {"world_size": p, "seq_len": args.seq_len, "verdict": report.verdict(), "passed": report.passed,
            "ranks": rows}


def describe(summary: dict) -> str:
    """The summary as a table."""
    lines = [summary["verdict"], f"{'layout':<11} {'rank':>4} {'blocks':>12} {'fwd bytes':>20} "
             f"{'bwd bytes':>20}   (measured / formula)"]
    for row in summary["ranks"]:
        lines.append(f"{row['layout']:<11} {row['rank']:>4} {row['blocks']:>5} / {row['blocks_formula']:<4} "
                     f"{row['bytes_forward']:>9} / {row['bytes_forward_formula']:<8} "
                     f"{row['bytes_backward']:>9} / {row['bytes_backward_formula']:<8}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The options, each with its default in the help."""
    p = argparse.ArgumentParser(prog="python -m distlab.context_parallel", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--world-size", type=int, default=2, metavar="N", help="ranks in the cp group")
    p.add_argument("--seq-len", type=int, default=24, help="tokens in the whole sequence")
    p.add_argument("--layout", choices=[*LAYOUTS, "both"], default="both", help="how the sequence is split")
    p.add_argument("--pad", action="store_true", help="pad a seq-len the layout cannot split (else error)")
    p.add_argument("--batch", type=int, default=2, help="sequences per batch")
    p.add_argument("--heads", type=int, default=2, help="attention heads")
    p.add_argument("--head-dim", type=int, default=8, help="width of one head")
    p.add_argument("--dtype", choices=list(DTYPES), default="float64", help="dtype of q, k, v")
    p.add_argument("--seed", type=int, default=0, help="seed of q, k, v")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    """Parse, check the values (usage errors, exit status 2), run the ranks, print the report."""
    p = parser()
    args = p.parse_args(argv)
    for name in ("world_size", "seq_len", "batch", "heads", "head_dim"):
        if getattr(args, name) < 1:
            p.error(f"argument --{name.replace('_', '-')}: {getattr(args, name)} must be a positive integer")
    args.layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    if not args.pad:
        for layout in args.layouts:
            try:
                check_seq_len(args.seq_len, args.world_size, layout)
            except ValueError as e:
                p.error(f"argument --seq-len: {e}; or pass --pad")
    if args.world_size == 1:
        reports = _run(args)
    else:
        reports = [rep for per_rank in launch.run(_run, args.world_size, args) for rep in per_rank]
    summary = summarize(sorted(reports, key=lambda r: (r.layout, r.rank)), args)
    print(json.dumps(summary, indent=1) if args.json else describe(summary), flush=True)
    if not summary["passed"]:
        raise SystemExit(1)
    return summary


if __name__ == "__main__":
    main()
