"""Text the planner prints: the table of its top candidates, and the published runs as a markdown table
(the book renders the latter from `published.RUNS`, so book and code show the same numbers)."""

from __future__ import annotations

from typing import Any

from distlab.plan.cost_model import TERMS
from distlab.plan.planner import judge
from distlab.plan.published import RUNS

TERM_HEADS = {"compute": "compute s", "recompute": "recomp s", "bubble": "bubble s", "tp": "TPcomm s",
              "pp": "PPcomm s", "cp": "CPcomm s", "dp": "DPcomm s"}


def _cells(r: dict[str, Any]) -> list[Any]:
    t = r["time"]
    return [r["dp"], r["tp"], r["pp"], r["cp"], r["zero"], r["recompute"], r["micro_batch"], r["interleave"],
            f"{r['peak_bytes'] / 1e9:.1f}", *(f"{t[k]:.3g}" for k in TERMS), f"{t['total']:.3g}",
            f"{r['tflops_per_gpu']:.0f}"]


def table(out: dict[str, Any], top: int = 10) -> str:
    """The first `top` kept candidates of a `__main__.report` (or its one pinned configuration) as aligned
    text: sizes, GB per GPU, the step-time terms in seconds, the step and model TFLOP/s per GPU; above it
    the model behind the parameter count, and when nothing fits, which rule removed how many."""
    head, rows = _head_and_rows(out, top)
    cols = ["dp", "tp", "pp", "cp", "ZeRO", "recompute", "b", "v", "GB/GPU", *(TERM_HEADS[k] for k in TERMS),
            "step s", "TFLOP/s"]
    lines = [head, f"  model: {out['model']['describe']}",
             "  sizes dp tp pp cp, then the step's terms in seconds (comm = the exposed communication)",
             "  ".join(f"{x:>9}" for x in cols)]
    lines += ["  ".join(f"{x!s:>9}" for x in _cells(r)) for r in rows]
    return "\n".join(lines + _notes(out, rows))


def _head_and_rows(out: dict[str, Any], top: int) -> tuple[str, list[dict[str, Any]]]:
    """The table's first line (model, cluster, batch, and what fits) and its rows."""
    c, eff = out["cluster"], out["efficiency"]
    where = (f"on {c['gpus']} {c['gpu']} ({c['nodes']} servers x {c['gpus_per_node']}), batch {out['batch']} "
             f"sequences, kernel efficiency {eff:.2f} of peak")
    if out.get("pinned"):
        verdict = "fits" if out["fits"] else "does NOT fit"
        return f"{out['model']['name']} {where}: the pinned configuration {verdict}", [out]
    return f"{out['model']['name']} {where}: {out['kept']} configurations fit", out["candidates"][:top]


def _notes(out: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The lines under the table: a batch rounded down, and, when nothing fits, what removed how many."""
    notes = []
    if rows and rows[0].get("effective_batch", out["batch"]) != out["batch"]:
        notes.append(f"  note: the batch of {out['batch']} rounds down to {rows[0]['effective_batch']} "
                     "(a multiple of dp x micro-batch)")
    if not out.get("pinned") and not out["kept"]:
        why = "; ".join(f"{rule}: {n:,}" for rule, n in sorted(out["removed"].items(), key=lambda x: -x[1]))
        notes.append(f"  removed: {why or 'no candidate in the search space'}")
    return notes


def published_markdown() -> str:
    """The published runs as a markdown table, with their sources as citations."""
    head = ("| run | GPUs | batch (seq.) | seq. length | TP | PP | DP | CP | reported TFLOP/s per GPU | "
            "source |")
    lines = [head, "|" + " --- |" * 10]
    for r in RUNS:
        seq = r.model_spec().seq
        lines.append(f"| {r.name} | {r.gpus} {r.gpu} | {r.batch} | {seq} | {r.tp} | {r.pp} | {r.dp} | "
                     f"{r.cp} | {r.tflops:g} | {{cite}}`{r.source}`, {r.where} |")
    return "\n".join(lines)


def judged_markdown(efficiency: float | None = None) -> str:
    """Each published run judged by the planner (`planner.judge`): GB per GPU against its HBM, predicted
    TFLOP/s per GPU beside the reported figure, their ratio, and the efficiency the report implies."""
    lines = ["| run | assumed ZeRO, recompute, v | peak GB per GPU (of HBM) | fits | predicted TFLOP/s per "
             "GPU | reported | ratio | implied efficiency |", "|" + " --- |" * 8]
    for r in RUNS:
        j = judge(r, efficiency)
        lines.append(f"| {r.name} | {r.zero}, {r.recompute}, {r.interleave} | {j['peak_bytes'] / 1e9:.0f} "
                     f"({j['hbm_bytes'] / 1e9:.0f}) | {'yes' if j['fits'] else 'no'} | "
                     f"{j['predicted_tflops_per_gpu']:.0f} | {r.tflops:g} | {j['ratio']:.2f} | "
                     f"{j['implied_efficiency']:.2f} |")
    return "\n".join(lines)
