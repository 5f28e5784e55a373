"""Chapter 7: memory. Where the bytes of a training step go, and every way to need fewer of them.

One idea per file (this chapter's core half, then ZeRO and its relatives):
- `accounting`: one training step measured exactly on any device: `saved_activation_bytes` (saved-tensor
  hooks, each storage once), `LiveBytes` (a dispatch mode that tracks live storages and the peak),
  `measure_step` -> `StepMemory`, and `cuda_peak_check` against `torch.cuda.max_memory_allocated`.
- `cost_model`: the closed forms: bytes per parameter (ZeRO's 2 + 2 + K), ZeRO's Table 1, Korthikanti et
  al.'s per-layer activations term by term, the course GPT's exact count, Chen et al.'s sqrt(n) segments.
- `precision`: mixed precision from scratch: `LossScaler` (static and dynamic), `unscale_`,
  `MasterWeights` (fp32 weight backup), the check against `torch.amp.GradScaler`, the underflow and
  accumulation demos, and `require_dtype` (a device that cannot compute in fp16 or bf16).
- `accumulation`: gradient accumulation with chapter 2's `no_sync`, and its memory.
- `recompute`: activation recomputation (none, the attention core, the MLP, whole blocks, sqrt(n)
  segments) with bitwise-equal gradients, `plan_for_budget` (the cost-aware policy) and
  `time_recompute` (the time overhead against one extra forward).
- `peak`: the peak of a training step, tensor by tensor: which phase, which tensors are alive, the
  recomputed working set and the temporaries (`predict_peak` -> `PeakPrediction`), beside
  `accounting.measure_gpt_step`; `python -m distlab.memory measure --json` prints both. It replays
  `gpt_step` and `gpt_ends` (the step's ops and their tensors, on one GPU of any layout) and
  `optimizer_step` (Adam's for-loop, foreach and fused forms; torch's default per device) on a
  `timeline.Timeline` (live bytes by kind).
- `peak_layout`: the same peak on the GPU of any layout that holds the most (`layout_peak`,
  `stage_peak`), the estimator's `peak_bytes`: the one memory number, which chapter 9's planner uses.
- `estimator`: bytes per GPU of any configuration (dp, tp, pp with 1F1B/GPipe/interleaved, cp, ZeRO
  0-3, recomputation, offload, precision); `python -m distlab.memory estimate ... --json`. Its terms:
  `config` (`MemoryConfig`, `validate`), `model_states` (per GPU) and `activations` (per layer, per stage).
- `figures`: the chapter's pictures and the estimator's explorer; `exercises`: the lab's checks.
- `bench`: ZeRO's benchmark against PyTorch's built-ins (recomputation's timing is
  `recompute.time_recompute`).
- `zero/`: ZeRO stages 0-3 over a process group: the chapter's readable engine (`ZeRO(model, stage,
  group=)`, its own Adam), the sharded optimizer that runs any torch optimizer (`ShardedOptimizer`,
  stages 1-2) and the per-module wrapper of stage 3 (`fully_shard`); see `distlab.memory.zero`'s map.
- `offload`: optimizer state and step on the CPU (ZeRO-Offload), activation offload, and the transfer
  model; `compression`: memory-efficient optimizers (Adafactor) and gradient compression (PowerSGD).
- `python -m distlab.memory`: the estimator, and a measured step of the course's GPT.
"""

from distlab.memory.accounting import (
    LiveBytes,
    StepMemory,
    cuda_peak_check,
    gpt_loss_fn,
    measure_gpt_step,
    measure_step,
    saved_activation_bytes,
)
from distlab.memory.accumulation import accumulate_gradients, accumulation_peak, split_batch
from distlab.memory.cost_model import (
    ZERO_TABLE_1,
    StepPrediction,
    gpt_activation_bytes,
    gpt_num_params,
    korthikanti_layer_bytes,
    layer_activation_terms,
    layer_bytes,
    model_state_bytes,
    predict_step,
    sqrt_segments,
    zero_table,
)
from distlab.memory.estimator import MemoryConfig, MemoryEstimate, estimate
from distlab.memory.peak import PeakPrediction, predict_peak
from distlab.memory.precision import (
    LossScaler,
    MasterWeights,
    compare_with_grad_scaler,
    require_dtype,
    unscale_,
    update_scale,
)
from distlab.memory.recompute import (
    layer_options,
    plan_cost,
    plan_for_budget,
    policy_plan,
    recompute_forward,
    time_recompute,
)
from distlab.memory.zero import ZeRO

__all__ = [
    "ZeRO",
    "ZERO_TABLE_1",
    "LiveBytes",
    "LossScaler",
    "MasterWeights",
    "MemoryConfig",
    "MemoryEstimate",
    "PeakPrediction",
    "StepMemory",
    "StepPrediction",
    "accumulate_gradients",
    "accumulation_peak",
    "compare_with_grad_scaler",
    "cuda_peak_check",
    "estimate",
    "gpt_activation_bytes",
    "gpt_loss_fn",
    "gpt_num_params",
    "korthikanti_layer_bytes",
    "layer_activation_terms",
    "layer_bytes",
    "layer_options",
    "measure_gpt_step",
    "measure_step",
    "model_state_bytes",
    "plan_cost",
    "plan_for_budget",
    "policy_plan",
    "predict_peak",
    "predict_step",
    "recompute_forward",
    "require_dtype",
    "saved_activation_bytes",
    "split_batch",
    "sqrt_segments",
    "time_recompute",
    "unscale_",
    "update_scale",
    "zero_table",
]
