"""The MoE search's part of `python -m distlab.plan`: its flags, their checks and the run.

    python -m distlab.plan --moe-model deepseek-v3 --gpu H800 --nodes 256 --batch 15360 \\
        --a2a-overlap --pipeline dualpipe --max-nodes 4 --fp8 --fp8-dispatch

The model is named (`moe_search.MOE_MODELS`), with `--seq` for its sequence; the cluster, batch, memory
and output flags are the dense planner's; the assumptions a run claims are flags of their own, each
printed (`MoEAssumptions.describe`). `--gpu H800` is an H100 with its NVLink cut to 200 GB/s per direction,
as `moe_published` prices DeepSeek-V3's cluster. Every flag the MoE search cannot honour is refused, in
one line naming the flag and the fix.
"""

from __future__ import annotations

import argparse
import json
import sys

from distlab.cli_types import at_least
from distlab.plan.inputs import ClusterSpec
from distlab.plan.moe_cost import FP8_CASTS, PIPELINES, MoEAssumptions
from distlab.plan.moe_published import H800_NVLINK_GB_PER_DIRECTION
from distlab.plan.moe_report import report, table
from distlab.plan.moe_search import MOE_MODELS, SAVINGS, SearchSpace

H800 = "H800"
WHOLE = at_least(1)
MOE_ONLY = ("ep", "etp", "max_etp", "savings", "a2a_overlap", "pipeline", "max_nodes", "fp8", "fp8_casts",
            "fp8_dispatch")
DENSE_ONLY = ("preset", "published", "moe_published", "layers", "hidden", "heads", "vocab", "kv_heads", "ffn",
              "max_cp", "explain")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The MoE search's flags (a group of their own)."""
    m = p.add_argument_group("mixture of experts (--moe-model: search the folded layouts, moe_search)")
    m.add_argument("--moe-model", choices=sorted(MOE_MODELS), help="search the expert layouts of this model "
                   "(its shape from chapter 6's published runs); --seq sets its sequence (default 4096)")
    m.add_argument("--ep", type=WHOLE, help="pin the expert-parallel size")
    m.add_argument("--etp", type=WHOLE, help="pin the experts' tensor-parallel size")
    m.add_argument("--max-etp", type=WHOLE, help="largest etp to try; default: --gpus-per-node")
    m.add_argument("--savings", nargs="+", choices=list(SAVINGS), help="DeepSeek-V3's activation savings "
                   "to try, in this order of preference (the first that fits is kept); default: all four")
    m.add_argument("--a2a-overlap", action="store_true", help="assume the all-to-all hidden behind another "
                   "micro-batch's compute up to each layer's compute (DualPipe's claim)")
    m.add_argument("--pipeline", choices=PIPELINES, help="the pipeline's bubble: 1f1b (default) or dualpipe")
    m.add_argument("--max-nodes", type=WHOLE, help="node-limited routing: each token on at most M servers")
    m.add_argument("--fp8", action="store_true", help="FP8 linear layers (chapter 7's FP8 cost)")
    m.add_argument("--fp8-casts", choices=FP8_CASTS, help="with --fp8: casts as separate kernels (default) "
                   "or fused away")
    m.add_argument("--fp8-dispatch", action="store_true", help="the forward dispatch sends FP8 values")


def cluster(a: argparse.Namespace) -> ClusterSpec:
    """The cluster of the flags; H800 as an H100 with NVLink cut to 200 GB/s per direction."""
    gpu, intra = a.gpu, a.intra_GBps
    if gpu == H800:
        gpu, intra = "H100", intra or H800_NVLINK_GB_PER_DIRECTION
    return ClusterSpec(gpu, a.nodes, a.gpus_per_node, intra, a.inter_GBps, a.hbm_gb)


def _given(a: argparse.Namespace, name: str) -> bool:
    value = getattr(a, name)
    return value is not None and value is not False


def refuse_moe_flags(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Without --moe-model, the MoE flags have nothing to act on: refuse them."""
    given = [_flag(n) for n in MOE_ONLY if _given(a, n)]
    if given:
        p.error(f"{', '.join(given)} apply to the MoE search; add --moe-model NAME "
                f"(one of {', '.join(sorted(MOE_MODELS))})")


def _check(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """The dense planner's flags the MoE search cannot honour, each refused with the fix."""
    given = [_flag(n) for n in DENSE_ONLY if _given(a, n)]
    if given:
        p.error(f"{', '.join(given)} do not apply with --moe-model (it brings its own shape; --seq sets its "
                "sequence); drop them")
    if a.dp is not None:
        p.error("--dp is derived in the MoE search (GPUs / (pp tp)); pin --pp and --tp instead")
    if a.cp not in (None, 1):
        p.error(f"--cp {a.cp}: the MoE cost model has no context-parallel term; use --cp 1 or drop it")
    if a.interleave not in (None, [1]):
        p.error("--interleave: the MoE search runs one chunk per stage (its memory estimate counts 1F1B's "
                "micro-batches); use --interleave 1 or drop it")
    if a.kernels != "block":
        p.error("--kernels parts prices dense blocks only; drop it with --moe-model")
    if a.fp8_casts and not a.fp8:
        p.error("--fp8-casts prices FP8 linear layers; add --fp8")


def _inputs(a: argparse.Namespace) -> tuple[MoEAssumptions, SearchSpace]:
    assumptions = MoEAssumptions(a2a_overlap=a.a2a_overlap, pipeline=a.pipeline or "1f1b",
                                 max_nodes=a.max_nodes, fp8=a.fp8, fp8_dispatch=a.fp8_dispatch,
                                 fp8_casts=a.fp8_casts or "separate", efficiency=a.efficiency)
    pins = tuple((n, getattr(a, n)) for n in ("pp", "tp", "ep", "etp") if getattr(a, n) is not None)
    space = SearchSpace(zero=tuple(a.zero or (1,)), savings=tuple(a.savings or SAVINGS),
                        max_micro_batch=a.max_micro_batch or 4, micro_batch=a.micro_batch, max_etp=a.max_etp,
                        pins=pins, usable_memory=a.usable_memory)
    return assumptions, space


def run(a: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    """Search, print the table (or --json) and return 0 when something fits, 1 when nothing does."""
    _check(a, p)
    try:
        assumptions, space = _inputs(a)
        out = report(a.moe_model, cluster(a), a.batch, assumptions, space, seq=a.seq or 4096)
    except ValueError as e:
        p.error(str(e))
    if a.gpu == H800:  # priced as an H100 (out["cluster"]["gpu"]); the table says what was asked for
        out["cluster"]["asked_for"] = H800
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print(table(out, a.top))
    return 0 if out["kept"] else 1
