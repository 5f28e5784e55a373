"""`python -m distlab.plan`: rank the ways to train a model on a cluster, or judge one pinned configuration.

    python -m distlab.plan --preset megatron-1t --gpu A100 --nodes 384 --batch 3072
    python -m distlab.plan --published llama3-405b-8k --json --explain
    python -m distlab.plan --moe-published all        # the published MoE rows, judged (moe_published)
    python -m distlab.plan --moe-model deepseek-v3 --gpu H800 --nodes 256 --batch 15360 \\
        --a2a-overlap --pipeline dualpipe --max-nodes 4 --fp8 --fp8-dispatch   # search MoE layouts
    python -m distlab.plan --preset bloom-176b --nodes 48 --batch 2048 --dp 8 --tp 4 --pp 12 --cp 1 \\
        --zero 1 --recompute full --micro-batch 2 --interleave 1 --json

Exit status: 0 when at least one configuration fits (a pinned one: when it fits), 1 when none does (the
table then says which rule removed how many candidates), 2 for bad input (one line naming the flag).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from distlab import device_names
from distlab.cli_types import at_least
from distlab.memory.estimate.cost_model import RECOMPUTE
from distlab.memory.estimate.optimizer_step import FORMS
from distlab.plan import limits, moe_cli, moe_published
from distlab.plan.candidates import CP_SPLITS, Candidate, Rejections, Settings
from distlab.plan.inputs import HBM_GB, PRESETS, ClusterSpec, ModelSpec, Workload, preset
from distlab.plan.planner import Row, explain, judge, pinned, plan
from distlab.plan.published import RUNS, PublishedRun, lookup
from distlab.plan.report import table

SHAPE = ("layers", "hidden", "heads", "vocab", "seq")
PIN = ("dp", "tp", "pp", "cp")
WHOLE, REAL = at_least(1), at_least(1e-300, float)


def gpu_name(text: str) -> str:
    """--gpu's value as a catalog name: "h200", "NVIDIA H200" and "NVIDIA H100 80GB HBM3" all work; an
    unknown name is passed on for argparse to refuse with the list of choices."""
    row = device_names.gpu_for_device(text)
    if row is not None:
        return row.name
    known = {g.lower(): g for g in (*HBM_GB, moe_cli.H800)}
    return known.get(text.strip().lower(), text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m distlab.plan", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model (a preset, a published run, or all five shape flags)")
    g.add_argument("--preset", choices=sorted(PRESETS), help="a named model shape")
    g.add_argument("--published", choices=[r.name for r in RUNS],
                   help="a published run: its model, cluster, batch and assumptions replace the model, "
                   "cluster and batch flags; the search-space flags still apply")
    g.add_argument("--moe-published", choices=["all", *(r.name for r in moe_published.JUDGED)],
                   help="judge a published MoE run (or all) on its folded layout and print the assumptions, "
                   "the prediction and the verdict (distlab.plan.moe_published); other flags are ignored")
    for name in SHAPE:
        g.add_argument(f"--{name}", type=WHOLE, help=f"model {name} (e-notation accepted)")
    g.add_argument("--kv-heads", type=WHOLE, help="key/value heads (grouped-query attention); default: heads")
    g.add_argument("--ffn", type=WHOLE, help="the MLP's hidden size; default: 4 x hidden")
    g.add_argument("--gated", action="store_true", help="a gated (SwiGLU) MLP: three h x ffn matrices")
    c = p.add_argument_group("cluster and batch")
    c.add_argument("--gpu", default="A100", type=gpu_name, choices=sorted((*HBM_GB, moe_cli.H800)),
                   help="GPU type (distlab.catalog); a device name as torch prints it also works; H800: "
                   "an H100 with NVLink cut to 200 GB/s per direction (distlab.plan.moe_published)")
    c.add_argument("--nodes", type=WHOLE, default=1, help="servers")
    c.add_argument("--gpus-per-node", type=WHOLE, default=8, help="GPUs per server")
    c.add_argument("--intra-GBps", type=REAL, help="NVLink GB/s per GPU per direction; default: catalog")
    c.add_argument("--inter-GBps", type=REAL, help="network GB/s per GPU per direction; default: catalog")
    c.add_argument("--hbm-gb", type=REAL, help="GPU memory in GB; default: distlab.plan.inputs.HBM_GB")
    c.add_argument("--batch", type=WHOLE, default=64, help="global batch in sequences (rounded down to a "
                   "multiple of dp x micro-batch when they do not divide it)")
    c.add_argument("--efficiency", type=REAL, help="fraction of peak FLOP/s the kernels reach; default: the "
                   "GPU's measured value (distlab.plan.efficiency)")
    c.add_argument("--kernels", choices=("block", "parts"), default="block", help="block: one measured "
                   "efficiency per GPU type; parts: each part of a step priced where it runs "
                   "(distlab.plan.kernel_time; H100 only)")
    s = p.add_argument_group("search space (or, with all of --dp --tp --pp --cp, one pinned configuration)")
    for name in PIN:
        s.add_argument(f"--{name}", type=WHOLE, help=f"pin the {name} size")
    s.add_argument("--zero", type=int, nargs="+", help="ZeRO stages to try; default: 0 1 2 3 (1 with "
                   "--moe-model, which takes 0 and 1)")
    s.add_argument("--recompute", nargs="+", default=list(RECOMPUTE), choices=RECOMPUTE,
                   help="recomputation policies to try")
    s.add_argument("--micro-batch", type=WHOLE, help="the micro-batch size: pinned, or the only one the "
                   "search tries (default: every divisor of a replica's share up to --max-micro-batch)")
    s.add_argument("--max-micro-batch", type=WHOLE, help="largest micro-batch size to try; default: 8 (4 "
                   "with --moe-model)")
    s.add_argument("--interleave", type=WHOLE, nargs="+", help="pipeline chunks v to try; default: 1 2 4 "
                   "(1 with --moe-model)")
    s.add_argument("--max-cp", type=WHOLE, help="largest context-parallel size to try; default: any")
    s.add_argument("--cp-split", choices=CP_SPLITS, default="zigzag", help="how cp cuts each sequence")
    s.add_argument("--usable-memory", type=REAL, default=0.9, help="fraction of HBM the estimate may fill")
    s.add_argument("--adam", choices=("default", *FORMS), default="default",
                   help="Adam's implementation (chapter 7's estimator); default: torch's on a GPU (foreach)")
    moe_cli.add_arguments(p)
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    o.add_argument("--top", type=WHOLE, default=10, help="rows of the table")
    o.add_argument("--explain", action="store_true",
                   help="say where the first choice differs from the published run (with --published)")
    return p


def _model(a: argparse.Namespace, p: argparse.ArgumentParser) -> ModelSpec:
    if a.preset:
        return preset(a.preset)
    if all(getattr(a, n) is not None for n in SHAPE):
        return ModelSpec(*(getattr(a, n) for n in SHAPE), kv_heads=a.kv_heads, ffn=a.ffn, gated=a.gated)
    p.error("give --preset NAME, --published NAME, or all of --layers --hidden --heads --vocab --seq")


def _inputs(a: argparse.Namespace, p: argparse.ArgumentParser
            ) -> tuple[ModelSpec, ClusterSpec, Workload, Settings, PublishedRun | None]:
    if a.published and (a.preset or any(getattr(a, n) is not None for n in SHAPE)):
        p.error(f"--published {a.published} brings its own model; drop --preset and the shape flags")
    run = lookup(a.published) if a.published else None
    if run is not None:
        return run.model_spec(), run.cluster(), run.workload(a.efficiency), run.settings, run
    cluster = moe_cli.cluster(a)
    settings = Settings(usable_memory=a.usable_memory, cp_split=a.cp_split, adam=a.adam)
    return _model(a, p), cluster, Workload(a.batch, a.efficiency, a.kernels), settings, None


def _pinned_candidate(a: argparse.Namespace, p: argparse.ArgumentParser) -> Candidate | None:
    given = [n for n in PIN if getattr(a, n) is not None]
    if not given:
        return None
    if len(given) < len(PIN):
        got = ", ".join("--" + n for n in given)
        p.error(f"pin all of --dp --tp --pp --cp (got {got}); or none to search")
    if len(a.zero) != 1 or len(a.recompute) != 1 or len(a.interleave) != 1 or a.micro_batch is None:
        p.error("a pinned configuration takes one --zero, one --recompute, one --interleave and "
                "--micro-batch")
    return Candidate(a.dp, a.tp, a.pp, a.cp, a.zero[0], a.recompute[0], a.micro_batch, a.interleave[0])


def _check(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    for name in ("micro_batch", "max_micro_batch"):
        value = getattr(a, name)
        if value is not None:
            try:
                limits.check_int("micro_batch", value, 1, "--" + name.replace("_", "-"))
            except ValueError as e:
                p.error(f"argument --{name.replace('_', '-')}: {e}")
    for z in a.zero:
        if z not in (0, 1, 2, 3):
            p.error(f"--zero {z} is not a ZeRO stage; choose among 0 1 2 3")
    if a.explain and not a.published:
        p.error("--explain compares with a published run; add --published NAME")


def _header(model: ModelSpec, cluster: ClusterSpec, workload: Workload, settings: Settings) -> dict[str, Any]:
    return {
        "model": {**{n: getattr(model, n) for n in (*SHAPE, "kv_heads", "ffn", "gated", "name")},
                  "params": model.params, "describe": model.describe()},
        "cluster": {"gpu": cluster.gpu, "nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
                    "gpus": cluster.gpus, "hbm_bytes": cluster.memory_bytes,
                    "intra_GBps": 1e-9 / cluster.intra.beta, "inter_GBps": 1e-9 / cluster.inter.beta},
        "batch": workload.batch, "efficiency": workload.eta(cluster.gpu), "kernels": workload.kernels,
        "assumptions": {"overlap": "dp overlaps the backward (FSDP, DDP) unless overlap_dp is false; tp, pp "
                        "and the cp ring's excess over attention are on the critical path",
                        "flops": "Narayanan et al. 2021 eq. (3) for the block's shape; recomputation adds a "
                        "forward", "placement": "tp innermost, then cp, dp, pp (distlab.mesh order)",
                        **settings.__dict__},
    }


def report(a: argparse.Namespace, p: argparse.ArgumentParser) -> dict[str, Any]:
    """Everything the CLI prints, as plain data."""
    _check(a, p)
    model, cluster, workload, settings, run = _inputs(a, p)
    out = _header(model, cluster, workload, settings)
    pin = _pinned_candidate(a, p)
    if pin is not None:
        r = pinned(model, cluster, workload, pin, settings)
        out.update(r.to_dict(cluster.gpus, workload.batch))
        out["pinned"] = True
        return out
    rej = Rejections()
    rows: list[Row] = plan(model, cluster, workload, settings, rej, zero_stages=tuple(a.zero),
                           recomputes=tuple(a.recompute), max_micro_batch=a.max_micro_batch,
                           micro_batch=a.micro_batch,
                           interleaves=tuple(a.interleave), max_cp=a.max_cp)
    out.update({"kept": len(rows), "removed": dict(rej),
                "candidates": [r.to_dict(cluster.gpus, workload.batch) for r in rows]})
    if run is not None:
        out["published"] = judge(run, workload.efficiency)
        out["explain"] = explain(rows[0], run, workload.efficiency) if rows else ["no candidate fits"]
    return out


def _dense_defaults(a: argparse.Namespace) -> None:
    """The dense search's defaults of the flags it shares with the MoE search (which has its own)."""
    a.zero = [0, 1, 2, 3] if a.zero is None else a.zero
    a.interleave = [1, 2, 4] if a.interleave is None else a.interleave
    a.max_micro_batch = 8 if a.max_micro_batch is None else a.max_micro_batch


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.moe_model:
        return moe_cli.run(a, p)
    moe_cli.refuse_moe_flags(a, p)
    _dense_defaults(a)
    if a.moe_published:
        if a.json:
            json.dump(moe_published.report(a.moe_published), sys.stdout, indent=1)
            print()
        else:
            print(moe_published.report_text(a.moe_published))
        return 0
    try:
        out = report(a, p)
    except ValueError as e:
        p.error(str(e))
    ok = out["fits"] if out.get("pinned") else out["kept"] > 0
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0 if ok else 1
    print(table(out, a.top))
    if a.explain:
        print("\nwhere the first choice differs from the published run:")
        print("\n".join(f"- {line}" for line in out["explain"]))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
