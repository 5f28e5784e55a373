"""The planner: evaluate every candidate, keep those that fit, rank them by predicted step time, and set
a published run beside them.

`evaluate` gives one `Row` per candidate (its memory estimate, whether its peak fits, its step-time terms);
`plan` keeps the rows that fit, fastest first, and counts in `Rejections` what each rule and the memory
filter removed; `pinned` evaluates one configuration given in full; `judge` evaluates a published
configuration under its stated assumptions beside the reported throughput, and gives the efficiency at
which the model would reproduce it; `explain` lists where the planner's first choice differs from the
published one and which terms differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distlab.memory.estimate.estimator import MemoryEstimate
from distlab.plan.candidates import (
    Candidate,
    Rejections,
    Settings,
    check_fits_grid,
    enumerate_candidates,
    fits,
    memory,
)
from distlab.plan.cost_model import TERMS, StepTime, step_time
from distlab.plan.inputs import ClusterSpec, ModelSpec, Workload
from distlab.plan.published import PublishedRun


@dataclass(frozen=True)
class Row:
    """One evaluated candidate."""

    candidate: Candidate
    memory: MemoryEstimate
    fits: bool
    time: StepTime

    def to_dict(self, gpus: int, batch: int | None = None) -> dict[str, Any]:
        """The row as plain data: the candidate, `fits`, `memory_gb` per GPU (chapter 7's estimator's peak,
        the same number as `python -m distlab.memory estimate --json`'s `peak_bytes`), `step_s`,
        `tflops_per_gpu` (model FLOPs per GPU per second) and every term in seconds."""
        out = {
            **self.candidate.to_dict(),
            "label": self.candidate.label(),
            "fits": self.fits,
            "memory_gb": self.memory.peak_bytes / 1e9,
            "peak_bytes": self.memory.peak_bytes,
            "memory": {k: self.memory.to_dict()[k] for k in
                       ("model_states_bytes", "activations_bytes", "total_bytes", "peak_bytes", "peak_phase",
                        "peak_where", "peak_stage")},
            "step_s": self.time.total,
            "tflops_per_gpu": self.time.tflops_per_gpu(gpus),
            "model_tflops_per_gpu": self.time.tflops_per_gpu(gpus),
            "terms_s": {t: getattr(self.time, t) for t in TERMS},
            "time": self.time.to_dict(),
        }
        if batch is not None:
            out["effective_batch"] = self.candidate.effective_batch(batch)
        return out


def row(model: ModelSpec, cluster: ClusterSpec, workload: Workload, c: Candidate,
        settings: Settings | None = None) -> Row:
    """One candidate evaluated: memory, fits, step time."""
    settings = settings or Settings()
    m = memory(model, cluster, workload, c, settings)
    return Row(c, m, fits(m, cluster, settings), step_time(model, cluster, workload, c, settings))


def evaluate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, settings: Settings | None = None,
             **space: Any) -> list[Row]:
    """Every candidate of the search space (`enumerate_candidates` takes `space`), evaluated."""
    return [row(model, cluster, workload, c, settings)
            for c in enumerate_candidates(model, cluster, workload, **space)]


def plan(model: ModelSpec, cluster: ClusterSpec, workload: Workload, settings: Settings | None = None,
         rejections: Rejections | None = None, **space: Any) -> list[Row]:
    """The candidates that fit in memory, fastest first (ties: less memory, then the label). What the rules
    and the memory filter removed is counted in `rejections` when given."""
    rej = rejections if rejections is not None else Rejections()
    settings = settings or Settings()
    kept = []
    for c in enumerate_candidates(model, cluster, workload, rejections=rej, **space):
        m = memory(model, cluster, workload, c, settings)
        if fits(m, cluster, settings):  # the step time only for those that fit
            kept.append(Row(c, m, True, step_time(model, cluster, workload, c, settings)))
        else:
            rej["does not fit in memory"] += 1
    return sorted(kept, key=lambda r: (round(r.time.total, 9), r.memory.peak_bytes, r.candidate.label()))


def pinned(model: ModelSpec, cluster: ClusterSpec, workload: Workload, c: Candidate,
           settings: Settings | None = None) -> Row:
    """A configuration given in full, checked against the rules (`check_fits_grid`) and evaluated."""
    check_fits_grid(model, cluster, workload, c)
    return row(model, cluster, workload, c, settings)


def judge(run: PublishedRun, efficiency: float | None = None) -> dict[str, Any]:
    """A published run under its assumptions: the estimator's peak per GPU against HBM, predicted time and
    TFLOP/s beside the reported ones (`ratio`), and `implied_efficiency`, the eta at which the model's step
    time matches the report (compute, recomputation and the idle time scale as 1/eta, communication not)."""
    model, cluster, workload = run.model_spec(), run.cluster(), run.workload(efficiency)
    eta = workload.eta(cluster.gpu)
    r = row(model, cluster, workload, run.candidate(), run.settings)
    t = r.time
    flops = t.hardware_flops if run.counts_recompute else t.model_flops
    reported_time = flops / (run.gpus * run.tflops * 1e12)
    scaled = (t.compute + t.recompute + t.bubble) * eta
    comm = t.total - t.compute - t.recompute - t.bubble
    implied = scaled / (reported_time - comm) if reported_time > comm else float("inf")
    predicted = t.tflops_per_gpu(run.gpus, run.counts_recompute)
    return {
        "name": run.name, "source": run.source, "where": run.where, **run.candidate().to_dict(),
        "gpus": run.gpus, "batch": run.batch, "seq": model.seq,
        "peak_bytes": r.memory.peak_bytes, "hbm_bytes": cluster.memory_bytes,
        "fits": r.fits, "headroom_bytes": cluster.memory_bytes - r.memory.peak_bytes,
        "time": t.to_dict(), "efficiency": eta,
        "predicted_tflops_per_gpu": predicted, "published_tflops_per_gpu": run.tflops,
        "ratio": predicted / run.tflops, "counts_recompute": run.counts_recompute,
        "reported_step_s": reported_time, "implied_efficiency": implied,
    }


def explain(best: Row, run: PublishedRun, efficiency: float | None = None) -> list[str]:
    """Sentences on where `best` differs from the published configuration: each differing choice, then
    the step-time terms that change by more than 5 % of the published step."""
    pub = run.candidate()
    lines = [f"{k}: planner {getattr(best.candidate, k)}, published {getattr(pub, k)}"
             for k in ("dp", "tp", "pp", "cp", "zero", "recompute", "micro_batch", "interleave")
             if getattr(best.candidate, k) != getattr(pub, k)]
    if not lines:
        return ["the planner's first choice is the published configuration"]
    t_pub = judge(run, efficiency)["time"]
    for term in TERMS:
        delta = getattr(best.time, term) - t_pub[term]
        if abs(delta) > 0.05 * t_pub["total"]:
            lines.append(f"{term} term: {getattr(best.time, term):.2f} s vs {t_pub[term]:.2f} s published")
    lines.append(f"predicted step: {best.time.total:.2f} s vs {t_pub['total']:.2f} s for the published "
                 f"configuration under the same model ({best.time.total / t_pub['total'] - 1:+.1%})")
    return lines
