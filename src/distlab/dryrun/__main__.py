"""Command line: one training step of chapter 9's trainer as one rank of a published layout, on a laptop.

    python -m distlab.dryrun --published llama3-405b-16k --rank 5
    python -m distlab.dryrun --published megatron-1t --rank 0 --layers 64 --microbatches 8 --json
    python -m distlab.dryrun --moe-published deepseek-v3 --rank 130 --savings recompute,fp8

It prints the calls the rank made per mesh axis (from `distlab.comm_log`) and the bytes it sent and held
beside chapter 9's traffic model and chapter 7's memory estimator (`cost_model.agreement`), then what the
rank held in all beside its GPU's HBM. It exits 1 if the closed forms differ by more than `--tolerance` or
the rank's memory does not fit its GPU. No memory is spent: the tensors are on the meta device and the
world is torch's fake process group. Attention saves what the fused kernel of a real run saves
(`--attention flash`); `--attention math` measures the s x s probabilities of the math path instead, the
path the meta device takes by itself. Chapter 7's estimator describes the first pipeline stage, so memory
is compared only for a rank of that stage.

`--moe-published NAME` runs instead one rank of a judged MoE layout (`moe_report`): its pipeline stage's
whole 1F1B step, with DeepSeek-V3's `--savings` (recompute, fp8, both or none), its messages and
all-to-alls beside chapter 9's model and its held memory beside chapter 7's, on every stage; it exits 1
when they differ by more than `--tolerance` or the rank does not fit its GPU.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from distlab.cli_types import DTYPES, add_dtype, add_json, between, non_negative_int, positive_int
from distlab.dryrun.attention import ATTENTIONS
from distlab.dryrun.cost_model import agreement, predicted
from distlab.dryrun.layouts import dry_run_names, from_published
from distlab.dryrun.moe_report import MOE_NAMES, moe_dry_run, moe_report, parse_savings
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
    p.add_argument("--moe-published", choices=MOE_NAMES, default=None,
                   help="run one rank of this judged MoE layout (chapter 9's moe_published) instead")
    p.add_argument("--savings", default="none",
                   help="with --moe-published: DeepSeek-V3's activation savings, none, recompute, fp8 or "
                        "recompute,fp8")
    add_dtype(p, "float32", "the trainer's dtype (chapter 7's estimator is compared in float32)")
    add_json(p)
    return p


def moe_main(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """--moe-published: one rank of a judged MoE layout, its whole step beside the models."""
    try:
        run = moe_dry_run(args.moe_published, args.rank, parse_savings(args.savings), args.microbatches)
    except ValueError as e:
        p.error(str(e))
    if args.json:
        print(json.dumps({"layout": run.name, "rank": run.step.rank, "stage": run.step.stage,
                          "gpu": run.gpu, "hbm_bytes": run.hbm_bytes, "fits": run.fits, "worst": run.worst(),
                          "rows": [list(r) for r in run.rows]}, indent=2))
    else:
        print(moe_report(run, args.tolerance))
    return 0 if run.worst() <= args.tolerance and run.fits else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.moe_published is not None:
        return moe_main(p, args)
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
