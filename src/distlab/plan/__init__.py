"""Chapter 9, the planner: which (dp, tp, pp, cp, ZeRO, recomputation, micro-batch, v) to train a model
with on a cluster, judged by chapter 7's memory estimator and ranked by a step-time model built from
chapter 1's collective costs, chapter 4's bubble and chapter 8's links.

One idea per file:
- `inputs`: `ModelSpec` (and `PRESETS`; grouped-query attention, FFN size, gated MLPs), `ClusterSpec`
  (links and peak FLOP/s from `distlab.catalog`, HBM capacity from `HBM_GB`), `Workload` (global batch,
  efficiency), all validated against `limits` (the bounds of every input, and an O(sqrt n) `divisors`).
- `efficiency`: eta, the kernels' fraction of peak per GPU type, from a published block time.
- `candidates`: `Candidate` (uneven layer splits), `Settings`, `enumerate_candidates`, `Rejections`,
  `memory` (chapter 7's `estimate`), `fits`.
- `cost_model`: `step_time` -> `StepTime`, the terms compute, recompute, bubble, tp, pp, cp, dp.
- `published`: `RUNS`, published configurations with their sources (Megatron-LM, Llama 3, BLOOM,
  Megatron-Turing NLG), and `OPTIONS_OF_THE_TIME`.
- `planner`: `evaluate`, `plan` (fits, fastest first), `pinned` (one configuration), `judge` (a
  published run), `explain`.
- `moe_cost`: a mixture of experts on a folded layout (`MoEConfig`, `MoEAssumptions`, `moe_step_time`):
  compute on the active parameters, the all-to-all priced by where its group lies, node-limited routing
  and the overlap a run claims; `moe_traffic`: the bytes it moves (`a2a_bytes`, `a2a_nodes`, `p2p_bytes`,
  the dry run's yardstick); `moe_published`: chapter 6's published MoE rows judged (`JUDGED`, `judge`,
  `table`); `moe_search`: the search over expert layouts (`search`: pp, tp, ep, etp folded over the
  same GPUs, the rules each candidate breaks counted, memory by `moe_peak_bytes`, ranked by
  `moe_step_time`); `moe_report` (its table, JSON and the published layout's rank) and `moe_cli` (its
  flags, `--moe-model`).
- `report`: the text table and the published runs as markdown; `figures`: the pictures.
- `python -m distlab.plan [--json] [--preset NAME | --published NAME | shape flags] [--dp --tp --pp --cp
  --zero --recompute --micro-batch --interleave]`; `--moe-model NAME [--ep --etp --a2a-overlap ...]` for the
  MoE search.
"""

from distlab.plan.candidates import Candidate, Settings, enumerate_candidates, fits, memory
from distlab.plan.cost_model import StepTime, step_time
from distlab.plan.inputs import PRESETS, ClusterSpec, ModelSpec, Workload, preset
from distlab.plan.planner import Row, evaluate, explain, judge, pinned, plan
from distlab.plan.published import RUNS, PublishedRun

__all__ = [
    "PRESETS", "RUNS", "Candidate", "ClusterSpec", "ModelSpec", "PublishedRun", "Row", "Settings",
    "StepTime", "Workload", "enumerate_candidates", "evaluate", "explain", "fits", "judge", "memory",
    "pinned", "plan", "preset", "step_time",
]
