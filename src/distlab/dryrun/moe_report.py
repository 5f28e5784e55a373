"""A published MoE rank's whole step as a report: what `moe_step.stage_step` measured beside the models, and
whether the rank fits its GPU (`python -m distlab.dryrun --moe-published deepseek-v3 --rank R`).

The models: chapter 9's pipeline messages (`plan.moe_traffic.p2p_bytes`) and all-to-alls (`a2a_bytes`, four
per MoE layer and micro-batch, BF16 dispatch as the dry run sends it) and chapter 7's held memory of the
rank's stage (`moe_activations.moe_stage_peaks`: ZeRO-1 model states, the micro-batches in flight under
1F1B, one layer's dispatch buffers), with DeepSeek-V3's `savings` where asked. The GPU is the one the
planner prices the row on (chapter 9's `moe_published.JUDGED`; DeepSeek-V3's H800 as the H100, both 80 GB).
Bytes print in GB (1e9 bytes) and differences in %, rounded so that the text is the same on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.dryrun.cost_model import relative
from distlab.dryrun.moe_step import StageStep, stage_step
from distlab.memory.estimate.moe_activations import moe_stage_peaks
from distlab.memory.estimate.moe_savings import Savings
from distlab.plan import moe_published
from distlab.plan.inputs import HBM_GB
from distlab.plan.moe_cost import MoEAssumptions
from distlab.plan.moe_traffic import a2a_bytes, p2p_bytes

__all__ = ["MOE_NAMES", "MoEDryRun", "moe_dry_run", "moe_report", "parse_savings"]

MOE_NAMES = tuple(r.name for r in moe_published.JUDGED)


def parse_savings(text: str) -> Savings:
    """"none", "recompute", "fp8" or "recompute,fp8" as DeepSeek-V3's `Savings`."""
    words = {w.strip() for w in text.split(",") if w.strip()}
    unknown = words - {"none", "recompute", "fp8"}
    if unknown or not words or ("none" in words and len(words) > 1):
        raise ValueError(f"--savings {text!r}: give none, recompute, fp8 or recompute,fp8")
    return Savings(recompute="recompute" in words, fp8="fp8" in words)


@dataclass(frozen=True)
class MoEDryRun:
    """One rank's measured step and the models' figures for it: rows of (what, measured, model)."""

    name: str
    gpu: str  # the published run's GPU
    priced_as: str  # the catalogue row its memory is read from
    hbm_bytes: float
    step: StageStep
    rows: tuple[tuple[str, float, float], ...]

    def worst(self) -> float:
        return max(relative(got, want) for _, got, want in self.rows)

    @property
    def fits(self) -> bool:
        return self.step.total <= self.hbm_bytes


def moe_dry_run(name: str, rank: int, savings: Savings, microbatches: int | None = None) -> MoEDryRun:
    """Run rank `rank` of the judged MoE row `name` for one step (`microbatches`, default the row's) and
    set it beside the models (module docstring). ValueError for an unknown name or rank."""
    if name not in MOE_NAMES:
        raise ValueError(f"no judged MoE layout named {name!r}; choose one of {', '.join(MOE_NAMES)}")
    row = next(r for r in moe_published.JUDGED if r.name == name)
    c = row.config()
    if not 0 <= rank < c.layout.world_size:
        raise ValueError(f"--rank {rank} is not a rank of {name}'s {c.layout.world_size} GPUs; choose "
                         f"0 <= rank < {c.layout.world_size}")
    m = microbatches or c.microbatches
    step = stage_step(c.shape, c.layout, rank, c.micro_batch, m, savings)
    est = moe_stage_peaks(c.shape, c.layout, c.micro_batch, m, zero=1, savings=savings)[step.stage]
    sends = p2p_bytes(c, step.stage, m)
    moe_layers = step.a2a_calls // 4 // m
    rows = (("sent pp activations", step.sends["fwd"][1], sends["fwd"][1]),
            ("sent pp gradients", step.sends["bwd"][1], sends["bwd"][1]),
            ("ep all-to-all buffers", step.a2a_bytes, moe_layers * m * sum(a2a_bytes(c, MoEAssumptions()))),
            ("held model states", step.model_states, est.model_states),
            ("held activations", step.activations, est.activations),
            ("held dispatch buffers", step.buffers, est.dispatch),
            ("held in all", step.total, est.peak_bytes))
    return MoEDryRun(name, row.run().gpu, row.gpu, HBM_GB[row.gpu][0] * 1e9, step, rows)


def moe_report(run: MoEDryRun, tolerance: float) -> str:
    """The report as text: the rank, the measured beside the models, the verdicts."""
    s = run.step
    lines = [f"rank {s.rank} of {run.name}: pipeline stage {s.stage}, {s.microbatches} micro-batches under "
             f"1F1B, {s.in_flight} in flight at the peak",
             f"{'what':<24}{'measured GB':>13}{'model GB':>12}{'diff':>9}"]
    for what, got, want in run.rows:
        lines.append(f"{what:<24}{got / 1e9:13.3f}{want / 1e9:12.3f}{relative(got, want):9.2%}")
    verdict = "ok" if run.worst() <= tolerance else "DIFFERS"
    lines.append(f"worst difference from the models {run.worst():.2%} (tolerance {tolerance:.0%}): {verdict}")
    share = s.total / run.hbm_bytes
    fits = "fits" if run.fits else "DOES NOT FIT"
    row = "" if run.priced_as == run.gpu else f" (the {run.priced_as}'s row)"
    lines.append(f"held in all {s.total / 1e9:.1f} GB, {share:.0%} of one {run.gpu}'s "
                 f"{run.hbm_bytes / 1e9:.0f} GB{row}: {fits}")
    return "\n".join(lines)
