"""Command line: one training step of chapter 9's trainer as one rank of a published layout, on a laptop.

    python -m distlab.dryrun --published llama3-405b-16k --rank 5
    python -m distlab.dryrun --published megatron-1t --rank 0 --layers 64 --microbatches 8 --json

It prints the calls the rank made per mesh axis (from `distlab.comm_log`) and the bytes it sent and held
beside chapter 9's traffic model and chapter 7's memory estimator (`cost_model.agreement`), then what the
rank held in all beside its GPU's HBM. It exits 1 if the closed forms differ by more than `--tolerance` or
the rank's memory does not fit its GPU. No memory is spent: the tensors are on the meta device and the
world is torch's fake process group. Attention saves what the fused kernel of a real run saves
(`--attention flash`); `--attention math` measures the s x s probabilities of the math path instead, the
path the meta device takes by itself. Chapter 7's estimator describes the first pipeline stage, so memory
is compared only for a rank of that stage.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from distlab.cli_types import DTYPES, add_dtype, add_json, between, non_negative_int, positive_int
from distlab.dryrun.attention import ATTENTIONS
from distlab.dryrun.cost_model import agreement, predicted
from distlab.dryrun.layouts import dry_run_names, from_published
from distlab.dryrun.report import agreement_table, calls_table, fits, fits_line, to_dict
from distlab.dryrun.run import dry_run


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m distlab.dryrun", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--published", choices=dry_run_names(), default="llama3-405b-16k",
                   help="the published layout (distlab.plan.published) to run one rank of")
    p.add_argument("--rank", type=non_negative_int, default=5, help="the global rank to be")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="run at reduced depth (at least pp blocks); default: the model's depth")
    p.add_argument("--microbatches", type=positive_int, default=None,
                   help="micro-batches per step (a smaller global batch); default: the published batch")
    p.add_argument("--tolerance", type=between(0.0, 1.0, float, "a fraction"), default=0.01,
                   help="largest relative difference from the closed forms that passes")
    p.add_argument("--attention", choices=sorted(ATTENTIONS), default="flash",
                   help="flash: attention saves what the fused kernel of a real run saves (a log-sum-exp "
                        "per row); math: the s x s probabilities of PyTorch's math path")
    add_dtype(p, "float32", "the trainer's dtype (chapter 7's estimator is compared in float32)")
    add_json(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        layout = from_published(args.published, args.layers, args.microbatches)
        stage = layout.coords(args.rank)["pp"]
    except ValueError as e:
        p.error(str(e))
    run = dry_run(layout, args.rank, DTYPES[args.dtype], args.attention)
    model = predicted(layout, args.rank, DTYPES[args.dtype].itemsize, args.attention)
    first_stage_fp32 = stage == 0 and args.dtype == "float32"  # what chapter 7's estimator describes
    a = agreement(run.traffic, run.memory.to_dict(), model, compare_memory=first_stage_fp32)
    if args.json:
        print(json.dumps(to_dict(run, a), indent=2))
    else:
        print(layout.describe())
        print(calls_table(run))
        print(agreement_table(a))
        verdict = "ok" if a.within(args.tolerance) else "DIFFERS"
        print(f"worst difference from the closed forms {a.worst():.2%} (tolerance {args.tolerance:.0%}): "
              f"{verdict}")
        print(fits_line(run))
    return 0 if a.within(args.tolerance) and fits(run) is not False else 1


if __name__ == "__main__":
    raise SystemExit(main())
