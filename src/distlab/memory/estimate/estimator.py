"""Bytes per GPU of any training configuration: model states and activations, every parallelism counted.

`estimate(MemoryConfig(...))` combines the chapter's closed forms:

- parameters per GPU: a GPT layer's 12 h^2 weights (and biases) split by tensor parallelism tp, the
  layers split over pp pipeline stages, the embedding on the first stage (Narayanan et al. 2021);
- model states per parameter 2 + 2 + K (mixed, K = 12) or 4 + 4 + 8 (fp32), divided by ZeRO's stage over
  the dp ranks (Rajbhandari et al. 2020, sec. 5); with offload the optimizer state lives in host memory
  instead (Ren et al. 2021, "ZeRO-Offload");
- activations per layer from Korthikanti et al. 2022 (Table 2: tp, sequence parallelism, selective or
  full recomputation), context parallelism cp dividing the sequence, and the micro-batches a pipeline
  stage holds at its worst moment: all m for GPipe, p for 1F1B, p + (p - 1)/v stages' worth for the
  interleaved schedule (Narayanan et al. 2021, sec. 2.2; Korthikanti et al. 2022, sec. 4.2.3).

The block's shape may be a modern one (`distlab.memory.estimate.shape`): grouped-query attention
(`kv_heads`), an explicit FFN size (`ffn`), a gated (SwiGLU) MLP (`gated`), untied input and output
embeddings (`tied=False`) and no learned position embedding (`positions=False`); and the pipeline may split
the layers unevenly (`layer_split`, the embedding on the first stage and the output layer on the last).
Without these options every result is chapter 7's GPT-3 block, unchanged.

`total_bytes`, the sum of these parts, is not what a GPU must hold: no tensor lives through the whole step.
`peak_bytes` is the step's peak on the GPU that holds the most (`peak_layout.layout_peak`): the same
tensors walked op by op through one micro-batch's forward and backward and the optimizer's step, with the
temporaries of each op and of Adam in the implementation that runs (`adam`, torch's default on `device`;
`optimizer_step`). It is the one memory number: the planner (chapter 9) fits and reports it. It leaves out
allocator fragmentation, which section 1 measures.
The terms live in three files, all re-exported here: `config` (`MemoryConfig` and `validate`, what the
command line builds), `model_states` (parameters per GPU and their bytes) and `activations` (bytes per
layer, and the layers a pipeline stage holds).

`fp8=True` (with mixed precision) is FP8 training as `distlab.memory.fp8` does it: the model states stay
2 + 2 + K (the FP8 weight is a cast copy made before each matmul, or gathered in FP8 under ZeRO-3), and the
inputs of the four linear layers of a block are saved for the backward in FP8, 1 byte each instead of 2
(DeepSeek-AI 2024, arXiv:2412.19437, sec. 3.3.3; `Fp8Linear(save_fp8=True)`); `LINEAR_INPUTS` names them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from distlab.memory.estimate.activations import (
    LINEAR_INPUTS,
    activation_bytes,
    fp8_saving,
    in_flight_layers,
    modern_layer_bytes,
    stage_activations,
)
from distlab.memory.estimate.config import SCHEDULES, MemoryConfig, total_params, validate
from distlab.memory.estimate.model_states import params_per_gpu, states_per_gpu
from distlab.memory.estimate.peak_layout import layout_peak

__all__ = ["LINEAR_INPUTS", "SCHEDULES", "MemoryConfig", "MemoryEstimate", "activation_bytes", "estimate",
           "fp8_saving", "in_flight_layers", "modern_layer_bytes", "params_per_gpu", "stage_activations",
           "states_per_gpu", "total_params", "validate"]


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU, by kind; `host_bytes` is what offload puts in the host's memory, per GPU."""

    n_params: float
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    model_states_bytes: float
    activations_bytes: float
    total_bytes: float
    host_bytes: float
    layers_per_stage: float
    in_flight_layers: float
    peak_bytes: float | None = None  # the step's peak on the GPU that holds the most (`peak_layout`)
    peak_phase: str | None = None
    peak_where: str | None = None
    peak_stage: int | None = None

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def estimate(c: MemoryConfig) -> MemoryEstimate:
    """Bytes per GPU of configuration `c` (see the module's docstring for each term)."""
    has_shape = validate(c)
    p, g, o, host = states_per_gpu(c)
    act = activation_bytes(c) if has_shape else 0.0
    flight = in_flight_layers(c) if has_shape else 0.0
    if has_shape and c.modern:
        flight = max(stage_activations(c), key=lambda sb: sb[1])[0]
    peak = layout_peak(c) if has_shape else None
    return MemoryEstimate(
        total_params(c),
        p,
        g,
        o,
        p + g + o,
        act,
        p + g + o + act,
        host,
        c.layers / c.pp if has_shape else 0.0,
        flight,
        *((peak.peak_bytes, peak.phase, peak.where, peak.stage) if peak else ()),
    )
