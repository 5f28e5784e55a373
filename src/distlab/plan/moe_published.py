"""Published MoE runs judged by the planner: chapter 6's rows (`distlab.moe.published_runs`) with a layout
and a reported throughput, each priced by `moe_cost.moe_step_time` under the assumptions it states.

The rows and their sources are chapter 6's; what is added here is, per row, the cluster it ran on and
what the planner must assume where the source is silent (each in `assumed`, printed with the verdict):

- **H800** (DeepSeek-V3's pre-training): the catalog has no H800. It is the H100's GH100 chip with the
  same Tensor Core peaks and 80 GB of HBM3 and NVLink cut to 400 GB/s in both directions (200 GB/s per
  direction), with one 400 Gb/s InfiniBand NIC per GPU (Zhao et al. 2025, "Insights into DeepSeek-V3",
  arXiv 2505.09343, as the search tool's secondary sources quote it; the paper was not re-read here.
  DeepSeek-AI 2024 sec. 3.2.2 gives 160 GB/s of NVLink against 50 GB/s of InfiniBand achieved). So it is
  priced as the catalog's H100 (DGX H100: one 400 Gb/s NIC per GPU) with `intra_GBps=200`.
- DeepSeek-V3's router sends each token to at most M = 4 nodes (DeepSeek-AI 2024, sec. 2.1.2; the
  released config's topk_group = 4 of n_group = 8), so every DeepSeek-V3 row is priced node-limited.
- FP8 rows use chapter 7's FP8 GEMM pricing; the Megatron-Bridge H100 DeepSeek-V3 row has no precision
  column but its note prices FP8 scaling recipes, so it is priced FP8 too.
- The micro-batch of the DeepSeek-V3 pre-training is not published: 1 sequence is assumed. DualPipe's
  claims (the all-to-all hidden, the smaller bubble) are that row's assumptions; the Megatron-Bridge rows
  are priced without all-to-all overlap (their tables do not say it is on).

The verdict: within +-20 % of the reported tokens/s/GPU ("agrees"), or not, with the ratio and the terms
that explain it (`explain`). DeepSeek-V3's pre-training reports GPU hours per trillion tokens: 180K H800
hours per 1e12 tokens is 1e12 / (180e3 x 3600) = 1,543 tokens/s/GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from distlab.expert_fold import ExpertFold
from distlab.layout import Layout
from distlab.memory.estimate.moe_states import moe_states
from distlab.moe.published_runs import PUBLISHED_RUNS, PublishedRun
from distlab.plan.efficiency import efficiency_for
from distlab.plan.inputs import ClusterSpec
from distlab.plan.moe_cost import MOE_TERMS, MoEAssumptions, MoEConfig, moe_step_time

TOLERANCE = 0.20
H800_NVLINK_GB_PER_DIRECTION = 200.0  # 400 GB/s both directions (Zhao et al. 2025, arXiv 2505.09343)


@dataclass(frozen=True)
class JudgedRow:
    """A chapter 6 row, the GPU the planner prices it on, and what it must assume."""

    name: str
    gpu: str
    assumptions: MoEAssumptions
    micro_batch: int | None = None  # None: the row's
    intra_GBps: float | None = None
    assumed: tuple[str, ...] = field(default_factory=tuple)

    def run(self) -> PublishedRun:
        return next(r for r in PUBLISHED_RUNS if r.name == self.name)

    def reported(self) -> float:
        """Reported tokens/s/GPU (from GPU hours per trillion tokens where that is what was reported)."""
        r = self.run()
        if r.tokens_per_s_per_gpu is not None:
            return r.tokens_per_s_per_gpu
        return 1e12 / (r.gpu_hours_per_trillion_tokens * 3600)

    def config(self) -> MoEConfig:
        r = self.run()
        layout = Layout(dp=r.gpus // (r.tp * r.cp * r.pp), pp=r.pp, tp=r.tp, cp=r.cp,
                        experts=ExpertFold(r.ep, r.etp or 1))
        cluster = ClusterSpec(gpu=self.gpu, nodes=r.gpus // r.gpus_per_node, gpus_per_node=r.gpus_per_node,
                              intra_GBps=self.intra_GBps)
        return MoEConfig(r.shape.model_shape(r.seq_len), layout, cluster, r.global_batch,
                         self.micro_batch or r.micro_batch, r.vp or 1)


_DS_M = "node-limited routing M = 4 (DeepSeek-V3's router, topk_group = 4)"
JUDGED: tuple[JudgedRow, ...] = (
    JudgedRow("deepseek-v3", "H100", MoEAssumptions(a2a_overlap=True, pipeline="dualpipe", max_nodes=4,
                                                   fp8=True, fp8_dispatch=True),
              micro_batch=1, intra_GBps=H800_NVLINK_GB_PER_DIRECTION,
              assumed=("H800 = H100 compute, NVLink 200 GB/s per direction", "micro-batch 1 (not published)",
                       "DualPipe: all-to-all hidden, bubble p/2 - 1 slots", _DS_M,
                       "FP8 GEMMs, FP8 dispatch")),
    JudgedRow("bridge-deepseek-v3-h100", "H100", MoEAssumptions(max_nodes=4, fp8=True),
              assumed=("FP8 (the table's note on FP8 scaling)", _DS_M, "all-to-all not overlapped")),
    JudgedRow("bridge-deepseek-v3-b200", "B200", MoEAssumptions(max_nodes=4, fp8=True),
              assumed=("FP8-MX priced as chapter 7's FP8 (H100's measured GEMM rates, carried)",
                       "eta carried from the H100", _DS_M, "all-to-all not overlapped")),
    JudgedRow("bridge-qwen3-30b-a3b-h100", "H100", MoEAssumptions(fp8=True),
              assumed=("FP8-CS priced as chapter 7's FP8", "all-to-all not overlapped")),
)


def judge(row: JudgedRow) -> dict[str, Any]:
    """The planner's tokens/s/GPU for `row` beside the reported one, the ratio, the verdict and the terms."""
    c = row.config()
    t = moe_step_time(c, row.assumptions)
    predicted = t.tokens_per_s_per_gpu(c.cluster.gpus)
    ratio = predicted / row.reported()
    bf16 = moe_step_time(c, replace(row.assumptions, fp8=False)).tokens_per_s_per_gpu(c.cluster.gpus)
    fused = moe_step_time(c, replace(row.assumptions, fp8_casts="fused")).tokens_per_s_per_gpu(c.cluster.gpus)
    return {"name": row.name, "predicted": predicted, "reported": row.reported(), "ratio": ratio,
            "agrees": abs(ratio - 1) <= TOLERANCE, "step_s": t.total, "bf16_predicted": bf16,
            "bf16_ratio": bf16 / row.reported(), "fp8": row.assumptions.fp8,
            "fused_predicted": fused, "fused_ratio": fused / row.reported(),
            "implied_eta": row.reported() * t.model_flops / t.tokens / c.cluster.peak_flops,
            "eta": row.assumptions.efficiency or efficiency_for(c.cluster.gpu),
            "model_states_gb": moe_states(c.shape, c.layout, zero=1).model_states_bytes / 1e9,
            "hbm_gb": c.cluster.memory_bytes / 1e9,
            "terms_s": {k: getattr(t, k) for k in MOE_TERMS}, "fp8_speedup": t.fp8_speedup,
            "assumptions": row.assumptions.describe(), "assumed": row.assumed, "gpus": c.cluster.gpus}


def verdict(j: dict[str, Any]) -> str:
    """One line: agrees within +-20 %, or why not with the numbers."""
    if j["agrees"]:
        return f"agrees within {TOLERANCE:.0%} (ratio {j['ratio']:.2f})"
    return f"off by {j['ratio'] - 1:+.0%}: " + explain(j)


def explain(j: dict[str, Any]) -> str:
    """Why a row is off, with numbers: the largest terms of the predicted step (each as a share of it), and
    for an FP8 row the speed-up chapter 7's FP8 pricing gave its linear layers and the prediction priced in
    BF16 instead."""
    terms = sorted(j["terms_s"].items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} {v / j['step_s']:.0%}" for k, v in terms if v > 0.05 * j["step_s"])
    text += (f"; the reported throughput is {j['implied_eta']:.2f} of the BF16 peak by the planner's FLOP "
             f"count, against eta = {j['eta']:.2f} (a GPT block of h = 6144)")
    if j["fp8"]:
        text += (f"; chapter 7's FP8 pricing makes the linear layers {j['fp8_speedup']:.2f}x as fast as BF16 "
                 f"(an expert GEMM with both operands cast, unfused); priced in BF16: "
                 f"{j['bf16_predicted']:,.0f} tok/s/GPU, ratio {j['bf16_ratio']:.2f}; with the casts fused "
                 f"(the FP8 GEMM alone): {j['fused_predicted']:,.0f}, ratio {j['fused_ratio']:.2f}")
    return text


def table(rows: tuple[JudgedRow, ...] = JUDGED) -> str:
    """The judgement as a Markdown table: row, predicted, reported, ratio, verdict."""
    lines = ["| row | predicted tok/s/GPU | reported | ratio | verdict |", "|---|---|---|---|---|"]
    for row in rows:
        j = judge(row)
        lines.append(f"| {row.name} | {j['predicted']:,.0f} | {j['reported']:,.0f} | {j['ratio']:.2f} | "
                     f"{verdict(j)} |")
    return "\n".join(lines)


def report(name: str = "all") -> dict[str, Any]:
    """The judgement of one judged row (`name`) or of all of them, as plain data (the command's --json)."""
    rows = JUDGED if name == "all" else tuple(r for r in JUDGED if r.name == name)
    if not rows:
        raise ValueError(f"moe-published={name!r} is unknown; choose all or one of "
                         f"{', '.join(r.name for r in JUDGED)}")
    return {"tolerance": TOLERANCE, "rows": [{**judge(r), "verdict": verdict(judge(r))} for r in rows]}


def report_text(name: str = "all") -> str:
    """What `python -m distlab.plan --moe-published NAME` prints: each row's assumptions, then the table."""
    rows = tuple(r for r in JUDGED if name in ("all", r.name))
    report(name)  # the same check of the name
    lines = [f"{r.name}: {r.assumptions.describe()}; assumed: {'; '.join(r.assumed)}" for r in rows]
    return "\n".join(lines) + "\n\n" + table(rows)
