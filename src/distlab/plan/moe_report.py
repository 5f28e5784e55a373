"""What `python -m distlab.plan --moe-model NAME` reports: the MoE search's ranked candidates
(`moe_search.search`), the count removed per rule, and where a published layout of the same model on the
same number of GPUs ranks (`moe_published.JUDGED`), as plain data and as a text table.

The published layout is looked up in the ranking by its sizes (pp, tp, dp, ep, etp) and its micro-batch
(1 where the source gives none, as `moe_published` assumes); the search runs one pipeline chunk per stage,
so a run that interleaved (v > 1) is also priced as it ran, beside its v = 1 rank. When it is not in the
ranking, the verdict says which rule removed it: a layout rule, or its peak with the lightest memory
option the search offers against the usable memory.
"""

from __future__ import annotations

from typing import Any

from distlab.memory.estimate.moe_activations import moe_peak_bytes
from distlab.plan.inputs import ClusterSpec
from distlab.plan.moe_cost import MOE_TERMS, MoEAssumptions, MoEConfig, moe_step_time
from distlab.plan.moe_published import JUDGED, JudgedRow
from distlab.plan.moe_search import MOE_MODELS, SAVINGS, MoECandidate, MoERow, SearchSpace, search, violation

TERM_HEADS = {"compute": "compute s", "a2a": "a2a s", "bubble": "bubble s", "tp": "TPcomm s",
              "pp": "PPcomm s", "dp": "DPsync s"}


def published_row(model: str, gpus: int) -> JudgedRow | None:
    """The judged published run of `model` (a `MOE_MODELS` name) on `gpus` GPUs, if there is one."""
    shape = MOE_MODELS[model]
    return next((r for r in JUDGED if r.run().shape == shape and r.run().gpus == gpus), None)


def _published_candidate(row: JudgedRow) -> MoECandidate:
    r = row.run()
    return MoECandidate(r.pp, r.tp, r.gpus // (r.pp * r.tp * r.cp), r.ep, r.etp or 1,
                        row.micro_batch or r.micro_batch or 1)


def _same(row: MoERow, c: MoECandidate) -> bool:
    k = row.candidate
    return (k.pp, k.tp, k.dp, k.ep, k.etp, k.micro_batch) == (c.pp, c.tp, c.dp, c.ep, c.etp, c.micro_batch)


def published_verdict(rows: list[MoERow], row: JudgedRow, ms_seq: int, cluster: ClusterSpec, batch: int,
                      assumptions: MoEAssumptions, space: SearchSpace) -> dict[str, Any]:
    """Where `row`'s layout ranks among `rows`, or why it is not there, and what its step costs beside the
    best's, term by term (module docstring)."""
    c, r = _published_candidate(row), row.run()
    out: dict[str, Any] = {"name": row.name, "layout": c.label().rsplit(" z", 1)[0], "interleave": r.vp or 1}
    rank = next((i for i, x in enumerate(rows) if _same(x, c)), None)
    if rank is None:
        return {**out, "rank": None, "why": _why_not(c, row, ms_seq, cluster, batch, assumptions, space)}
    mine, best = rows[rank], rows[0]
    out.update(rank=rank + 1, of=len(rows), step_s=mine.time.total, best=best.candidate.label(),
               best_step_s=best.time.total, options=f"z{mine.candidate.zero} {mine.candidate.savings}",
               difference_s={k: getattr(mine.time, k) - getattr(best.time, k) for k in MOE_TERMS})
    if (r.vp or 1) > 1:
        ms = MOE_MODELS[_name(row)].model_shape(ms_seq)
        config = MoEConfig(ms, c.layout, cluster, batch, c.micro_batch, r.vp)
        out["as_run_step_s"] = moe_step_time(config, assumptions).total
    return out


def _name(row: JudgedRow) -> str:
    return next(n for n, s in MOE_MODELS.items() if s == row.run().shape)


def _why_not(c: MoECandidate, row: JudgedRow, seq: int, cluster: ClusterSpec, batch: int,
             a: MoEAssumptions, space: SearchSpace) -> str:
    ms = MOE_MODELS[_name(row)].model_shape(seq)
    rule = violation(ms, cluster, batch, c.pp, c.tp, c.ep, c.etp, a.max_nodes)
    if rule:
        return f"layout: {rule}"
    z, s = max(space.zero), ("both" if "both" in space.savings else space.savings[-1])
    peak = moe_peak_bytes(ms, c.layout, c.micro_batch, batch // (c.dp * c.micro_batch), z, savings=SAVINGS[s])
    usable = space.usable_memory * cluster.memory_bytes
    hbm = cluster.memory_bytes / 1e9
    return (f"its peak with ZeRO-{z} and savings {s!r} is {peak.peak_bytes / 1e9:.1f} GB, above the "
            f"{usable / 1e9:.1f} GB usable ({space.usable_memory:.0%} of {hbm:.0f} GB)")


def report(model: str, cluster: ClusterSpec, batch: int, assumptions: MoEAssumptions, space: SearchSpace,
           seq: int = 4096) -> dict[str, Any]:
    """The search for `model` as plain data (the command's --json)."""
    ms = MOE_MODELS[model].model_shape(seq) if model in MOE_MODELS else None
    if ms is None:
        raise ValueError(f"moe_model={model!r} is unknown; choose one of {', '.join(MOE_MODELS)}")
    rows, removed = search(ms, cluster, batch, assumptions, space)
    out: dict[str, Any] = {
        "model": model, "params": ms.params, "active_params": ms.active_params, "seq": seq, "batch": batch,
        "cluster": {"gpu": cluster.gpu, "nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
                    "gpus": cluster.gpus, "hbm_bytes": cluster.memory_bytes,
                    "intra_GBps": 1e-9 / cluster.intra.beta, "inter_GBps": 1e-9 / cluster.inter.beta},
        "assumptions": assumptions.describe(), "usable_memory": space.usable_memory,
        "kept": len(rows), "removed": dict(removed.most_common()), "candidates": [r.to_dict() for r in rows]}
    row = published_row(model, cluster.gpus)
    if row is not None:
        out["published"] = published_verdict(rows, row, seq, cluster, batch, assumptions, space)
    return out


def _cells(r: dict[str, Any], rank: int) -> list[str]:
    t = r["terms_s"]
    where = "node" if r["a2a_nodes"] == 1 else f"{r['a2a_nodes']} nodes"
    return [str(rank), r["label"], where, f"{r['peak_bytes'] / 1e9:.1f}",
            *(f"{t[k]:.2f}" for k in TERM_HEADS), f"{r['step_s']:.2f}", f"{r['tokens_per_s_per_gpu']:,.0f}"]


def verdict_text(p: dict[str, Any]) -> str:
    """One sentence on the published layout: its rank and its step beside the best's, or why it is out."""
    if p["rank"] is None:
        return f"published {p['name']} ({p['layout']}) is not among the candidates: {p['why']}"
    diff = sorted(p["difference_s"].items(), key=lambda kv: -abs(kv[1]))
    terms = ", ".join(f"{k} {v:+.2f} s" for k, v in diff if abs(v) >= 0.005)
    text = (f"published {p['name']} ({p['layout']}, {p['options']}) ranks {p['rank']} of {p['of']}: "
            f"{p['step_s']:.2f} s per step against {p['best_step_s']:.2f} s for the best ({p['best']})")
    text += f"; against the best: {terms}" if p["rank"] > 1 else ""
    if "as_run_step_s" in p:
        text += f"; as run (v = {p['interleave']}): {p['as_run_step_s']:.2f} s"
    return text


def table(out: dict[str, Any], top: int = 10) -> str:
    """The first `top` candidates as aligned text, the removals per rule and the published verdict."""
    c = out["cluster"]
    gpu = c["gpu"] if "asked_for" not in c else \
        f"{c['asked_for']} (priced as {c['gpu']} with NVLink {c['intra_GBps']:g} GB/s per direction)"
    lines = [f"{out['model']} ({out['params'] / 1e9:.1f}B, {out['active_params'] / 1e9:.1f}B active) on "
             f"{c['gpus']} {gpu} ({c['nodes']} servers x {c['gpus_per_node']}), batch {out['batch']} x "
             f"{out['seq']} tokens: {out['kept']:,} configurations fit",
             f"  assumptions: {out['assumptions']}",
             f"  memory: moe_peak_bytes at most {out['usable_memory']:.0%} of {c['hbm_bytes'] / 1e9:.0f} GB; "
             "a2a: where the ep group lies"]
    cols = ["#", "layout", "a2a", "GB/GPU", *TERM_HEADS.values(), "step s", "tok/s/GPU"]
    cells = [cols] + [_cells(r, i + 1) for i, r in enumerate(out["candidates"][:top])]
    widths = [max(len(row[j]) for row in cells) for j in range(len(cols))]
    lines += ["  " + "  ".join(x.ljust(w) if j == 1 else x.rjust(w)
                               for j, (x, w) in enumerate(zip(row, widths, strict=True))) for row in cells]
    lines.append("  removed: " + ("; ".join(f"{k}: {n:,}" for k, n in out["removed"].items()) or "none"))
    if "published" in out:
        lines.append("  " + verdict_text(out["published"]))
    return "\n".join(lines)


def markdown(out: dict[str, Any], top: int = 10) -> str:
    """The first `top` candidates as a Markdown table (the book's), the same cells as `table`."""
    cols = ["#", "layout", "a2a group", "GB/GPU", *TERM_HEADS.values(), "step s", "tok/s/GPU"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cells(r, i + 1)) + " |" for i, r in enumerate(out["candidates"][:top])]
    return "\n".join(lines)
