"""Chapter 7: memory. Where the bytes of a training step go, and every way to need fewer of them.

Split by concern, one idea per file in each folder (see each folder's map):
- `estimate/`: the bytes per GPU of any configuration, predicted without running it: the closed forms
  (`cost_model`), the block's `shape`, `MemoryConfig`, the estimator's terms (`model_states`,
  `activations`) and its one memory number, the peak of a step replayed tensor by tensor (`peak_layout`,
  from `gpt_step`, `gpt_ends`, `optimizer_step` on a `timeline`); `estimator.estimate`.
- `measure/`: the bytes of a step counted on a device (`accounting`: `LiveBytes`, `measure_step`,
  `saved_activation_bytes`, `cuda_peak_check`, `measure_gpt_step`), beside the tensor-by-tensor
  prediction of the same step (`peak`, `peak_zero`, `peak_pipeline`, `accumulation_peak`).
- `techniques/`: the ways to need fewer bytes: mixed `precision`, `recompute`, gradient `accumulation`,
  Adafactor and gradient `compression` (PowerSGD itself is chapter 2's, `distlab.data_parallel.powersgd`).
- `zero/`: ZeRO stages 0-3 over a process group: the chapter's readable engine (`ZeRO(model, stage,
  group=)`, its own Adam), the sharded optimizer that runs any torch optimizer (`ShardedOptimizer`,
  stages 1-2), the per-module wrapper of stage 3 (`fully_shard`), and ZeRO-Offload (`zero.offload`:
  optimizer state and step on the CPU, activation offload, the transfer model); see its map.
- `fp8/`: FP8 training from scratch: the formats, scaling, an FP8 linear layer, FP8 all-gathers, when
  it pays.
- `muon/`: optimizers that do not shard elementwise: Muon on the data-parallel group, whole matrices on
  owner ranks (`OwnerMuon`) or moved there from ZeRO's layout by all-to-all (`AllToAllMuon`), their cost
  model, Muon with tensor parallelism, and what Shampoo's and SOAP's preconditioners cost when sharded.
- The chapter's roles: `figures` (the pictures and the estimator's explorer), `exercises` (the lab's
  checks), `bench` (ZeRO's benchmark against PyTorch's built-ins; recomputation's timing is
  `techniques.recompute.time_recompute`), and `python -m distlab.memory` (`__main__`: the estimator, and
  a measured step of the course's GPT).
- The modules' old homes, which the labs and the book import (`accounting`, `accumulation`,
  `compression`, `cost_model`, `estimator`, `offload`, `peak`, `precision`, `recompute`, `shape`), are
  each a few lines that name the new one.
"""

from distlab.memory.estimate.cost_model import (
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
from distlab.memory.estimate.estimator import MemoryConfig, MemoryEstimate, estimate
from distlab.memory.measure.accounting import (
    LiveBytes,
    StepMemory,
    cuda_peak_check,
    gpt_loss_fn,
    measure_gpt_step,
    measure_step,
    saved_activation_bytes,
)
from distlab.memory.measure.accumulation_peak import accumulation_peak
from distlab.memory.measure.peak import PeakPrediction, predict_peak
from distlab.memory.techniques.accumulation import accumulate_gradients, split_batch
from distlab.memory.techniques.precision import (
    LossScaler,
    MasterWeights,
    compare_with_grad_scaler,
    require_dtype,
    unscale_,
    update_scale,
)
from distlab.memory.techniques.recompute import (
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
