"""Closed-form predictions of training memory: model states, activations, and what recomputation saves.

**Model states** (Rajbhandari et al. 2020, "ZeRO", sec. 3.1). With Psi parameters, plain fp32 Adam keeps
4 bytes of weight, 4 of gradient and K = 8 of optimizer state (m and v) per parameter: 16 Psi. Mixed
precision keeps 16-bit weights and gradients (2 + 2) and an fp32 master copy beside m and v, K = 12:
again 16 Psi, the "2 + 2 + K" of the paper. ZeRO stage 1 shards the K Psi over N_d data-parallel ranks,
stage 2 the gradients too, stage 3 everything (`model_state_bytes`; Table 1 of the paper in
`ZERO_TABLE_1`).

**Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", sec. 4.1). One transformer layer with 16-bit activations and dropout saves
s b h (34 + 5 a s / h) bytes (`korthikanti_layer_bytes`). `layer_activation_terms` lists the pieces,
one per saved tensor, so that the same sum can be taken for a layer that differs from the paper's, as the
course's GPT does: no dropout masks when dropout is 0, LayerNorm statistics the paper leaves out, and on
PyTorch's flash-attention kernel no s x s matrix at all (`gpt_activation_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distlab.model_shape import ModelShape
from distlab.models import GPTConfig

PRECISIONS = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}  # bytes per parameter: weight, gradient, K
ATTENTIONS = ("flash", "math")
RECOMPUTE = ("none", "selective", "full")

# Rajbhandari et al. 2020 (SC'20; arXiv:1910.02054), Table 1 ("Per-device memory consumption of different
# optimizations in ZeRO-DP as a function of DP degree", sec. 5), its "7.5B Model (GB)" columns P_os,
# P_os+g and P_os+g+p, for its six DP degrees N_d (Psi = 7.5e9, K = 12; the paper's rounding). Every row
# checked against the table on 2026-11-24. The first entry of each row, plain data parallelism, is not a
# column of Table 1: it is the 16 Psi = 120 GB "with standard DP" of sec. 5.2 and Figure 1, the same for
# every N_d. Tuple: (baseline, P_os, P_os+g, P_os+g+p).
ZERO_TABLE_1 = {
    1: (120, 120, 120, 120),
    4: (120, 52.5, 41.3, 30),
    16: (120, 35.6, 21.6, 7.5),
    64: (120, 31.4, 16.6, 1.88),
    256: (120, 30.4, 15.4, 0.47),
    1024: (120, 30.1, 15.1, 0.12),
}


def check_precision(precision: str) -> tuple[int, int, int]:
    """(weight, gradient, optimizer) bytes per parameter for `precision`, or a ValueError."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision={precision!r} is unknown; choose 'fp32' (4 + 4 + 8 bytes per parameter) "
            "or 'mixed' (fp16/bf16 weights and gradients, fp32 master copy: 2 + 2 + 12)"
        )
    return PRECISIONS[precision]


def check_zero_stage(zero_stage: int, name: str = "zero_stage") -> int:
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise ValueError(
            f"{name}={zero_stage!r} is not a ZeRO stage; choose 0 (replicated), 1 (shard the "
            "optimizer state), 2 (and the gradients) or 3 (and the parameters)"
        )
    return zero_stage


def model_state_bytes(
    n_params: float, precision: str | tuple[int, int, int] = "mixed", zero_stage: int = 0, dp: int = 1
) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer) bytes per device for `n_params` parameters, ZeRO stage
    `zero_stage` over `dp` data-parallel ranks (Rajbhandari et al. 2020, sec. 5 and Table 1):
    stage 1 divides K Psi by N_d, stage 2 also the gradients, stage 3 also the parameters.
    `precision` is "mixed" (2 + 2 + 12), "fp32" (4 + 4 + 8), or (weight, gradient, optimizer) bytes."""
    w, g, k = precision if isinstance(precision, tuple) else check_precision(precision)
    check_zero_stage(zero_stage)
    if dp < 1:
        raise ValueError(f"dp={dp} must be at least 1")
    return (
        w * n_params / (dp if zero_stage >= 3 else 1),
        g * n_params / (dp if zero_stage >= 2 else 1),
        k * n_params / (dp if zero_stage >= 1 else 1),
    )


def zero_table(
    psi: float = 7.5e9, dps: tuple[int, ...] = tuple(ZERO_TABLE_1)
) -> dict[int, tuple[float, ...]]:
    """Table 1 of the ZeRO paper recomputed: GB (1e9 bytes) per device for stages 0 to 3, by N_d."""
    return {dp: tuple(sum(model_state_bytes(psi, "mixed", z, dp)) / 1e9 for z in range(4)) for dp in dps}


def gpt_num_params(n_layer: int, n_embd: int, vocab_size: int, block_size: int, bias: bool = True) -> int:
    """Parameters of `distlab.models.GPT`, counted once each (the output layer is the tied embedding):
    per layer 12 h^2 weights (c_attn 3h^2, c_proj h^2, c_fc 4h^2, c_proj 4h^2) and, with bias, 13 h
    biases and LayerNorm parameters; then V h + s h embeddings and the final LayerNorm."""
    # `distlab.model_shape` counts it (the count does not depend on the number of heads)
    shape = ModelShape(layers=n_layer, hidden=n_embd, heads=1, vocab=vocab_size, seq=block_size, bias=bias)
    return shape.params


def layer_activation_terms(
    s: int,
    b: int,
    h: int,
    a: int,
    dtype_bytes: int = 2,
    attention: str = "math",
    dropout: bool = True,
    ln_stats: bool = False,
) -> dict[str, tuple[float, bool]]:
    """The tensors one transformer layer saves for backward, name -> (bytes, split by tensor parallelism).

    Following Korthikanti et al. 2022, sec. 4.1, with activations of `dtype_bytes` bytes and dropout
    masks of one byte: attention block 11 sbh + 5 a s^2 b and MLP 19 sbh with 16-bit activations,
    two LayerNorm inputs 4 sbh. `attention="flash"` replaces the s x s softmax (and its dropout) by the
    fp32 log-sum-exp per query and head, a s b * 4 bytes, which is what a flash-attention kernel saves
    (its output is the projection's input, already counted). `ln_stats` adds LayerNorm's fp32 mean and
    reciprocal standard deviation, 2 b s numbers per LayerNorm, which the paper leaves out.
    """
    if attention not in ATTENTIONS:
        raise ValueError(
            f"attention={attention!r} is unknown; choose 'math' (saves the s x s softmax) or "
            "'flash' (saves one log-sum-exp per query and head)"
        )
    e, sbh = dtype_bytes, s * b * h
    t: dict[str, tuple[float, bool]] = {
        "layernorm inputs": (2 * sbh * e, False),
        "qkv input": (sbh * e, False),
        "q, k, v": (3 * sbh * e, True),
        "projection input": (sbh * e, True),
        "mlp input": (sbh * e, False),
        "gelu input": (4 * sbh * e, True),
        "mlp output-layer input": (4 * sbh * e, True),
    }
    if attention == "math":
        t["softmax output"] = (a * s * s * b * e, True)
        if dropout:
            t["attention dropout mask"] = (a * s * s * b, True)
            t["attention dropout output"] = (a * s * s * b * e, True)
    else:
        t["log-sum-exp"] = (a * s * b * 4, True)
    if dropout:
        t["dropout masks (2)"] = (2 * sbh, False)
    if ln_stats:
        t["layernorm statistics"] = (2 * 2 * b * s * 4, False)
    return t


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int) -> float:
    """Korthikanti et al. 2022, eq. (1): s b h (34 + 5 a s / h) bytes per layer, 16-bit, with dropout."""
    return s * b * h * (34 + 5 * a * s / h)


def core_terms(attention: str) -> tuple[str, ...]:
    """The terms of the attention core (softmax and what hangs on it) that selective recomputation drops."""
    if attention == "flash":
        return ("log-sum-exp",)
    return ("softmax output", "attention dropout mask", "attention dropout output")


def layer_bytes(
    s: int,
    b: int,
    h: int,
    a: int,
    dtype_bytes: int = 2,
    attention: str = "math",
    dropout: bool = True,
    ln_stats: bool = False,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """One layer's saved bytes per device with tensor parallelism `tp` (Korthikanti et al. 2022, Table 2):
    terms inside the tensor-parallel regions divide by tp; with sequence parallelism all of them do.
    `recompute="selective"` drops the attention core, `"full"` keeps only the layer's input."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r} is unknown; choose one of {', '.join(RECOMPUTE)}")
    if recompute == "full":
        return s * b * h * dtype_bytes / (tp if sequence_parallel else 1)
    terms = layer_activation_terms(s, b, h, a, dtype_bytes, attention, dropout, ln_stats)
    dropped = core_terms(attention) if recompute == "selective" else ()
    return sum(
        n / (tp if split or sequence_parallel else 1) for k, (n, split) in terms.items() if k not in dropped
    )


def head_bytes(
    s: int, b: int, h: int, vocab: int, dtype_bytes: int = 2, tp: int = 1, ln_stats: bool = False
) -> float:
    """What the layers outside the blocks save (Korthikanti et al. 2022, sec. 4.3, without dropout):
    the final LayerNorm's input and the output layer's input, sbh each, and the fp32 log-softmax of the
    logits, 4 s b V (split over the vocabulary by tp); plus the token ids and targets, int64."""
    out = 2 * s * b * h * dtype_bytes + 4 * s * b * vocab / tp + 2 * 8 * s * b
    return out + (2 * b * s * 4 if ln_stats else 0)


def gpt_activation_bytes(
    config: GPTConfig,
    batch: int,
    seq: int,
    attention: str = "flash",
    dtype_bytes: int = 4,
    recompute: str = "none",
) -> float:
    """Bytes `distlab.models.GPT` saves for backward in one forward pass (float32 by default).

    It differs from the paper's layer in four ways, each modelled: dropout is 0, so no masks; the
    LayerNorm statistics are counted; the loss is computed in the model's dtype, and only the
    log-softmax output is saved; with PyTorch's flash kernel (the CPU default) attention saves a
    log-sum-exp instead of the s x s matrix. The position ids (s int64) and the loss's 4-byte weight
    total are added too.
    """
    if config.dropout != 0:
        raise ValueError(
            f"dropout={config.dropout} is not modelled here; use GPTConfig(dropout=0.0), or add "
            "Korthikanti et al.'s one-byte masks by hand"
        )
    s, b, h, a, v = seq, batch, config.n_embd, config.n_head, config.vocab_size
    per_layer = layer_bytes(
        s, b, h, a, dtype_bytes, attention, dropout=False, ln_stats=True, recompute=recompute
    )
    head = 2 * s * b * h * dtype_bytes + s * b * v * dtype_bytes + 2 * 8 * s * b + 2 * b * s * 4
    return config.n_layer * per_layer + head + 8 * s + 4


@dataclass(frozen=True)
class StepPrediction:
    """Predicted bytes of one training step of the course's GPT, by kind."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: float

    @property
    def model_states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def predict_step(
    config: GPTConfig, batch: int, seq: int, attention: str = "flash", recompute: str = "none"
) -> StepPrediction:
    """fp32 Adam on `distlab.models.GPT`: 4 + 4 + 8 bytes per parameter (plus Adam's step counter, one
    4-byte number per parameter tensor) and `gpt_activation_bytes`."""
    n = ModelShape.from_gpt_config(config).params
    tensors = config.n_layer * (12 if config.bias else 6) + (4 if config.bias else 3)
    return StepPrediction(
        4 * n, 4 * n, 8 * n + 4 * tensors, gpt_activation_bytes(config, batch, seq, attention, 4, recompute)
    )


def sqrt_segments(n_layers: int) -> list[int]:
    """Chen et al. 2016, sec. 4.1: cut n layers into about sqrt(n) segments of about sqrt(n) layers, so
    that the n/k kept segment inputs plus the k layers recomputed at a time, n/k + k, is smallest."""
    if n_layers < 1:
        raise ValueError(f"n_layers={n_layers} must be at least 1")
    k = max(1, round(math.sqrt(n_layers)))
    count = math.ceil(n_layers / k)
    base, extra = divmod(n_layers, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def segment_peak_units(segments: list[int]) -> int:
    """Chen et al.'s cost of a segmentation, in units of one layer's activations: every segment keeps its
    input (one unit each), and backward recomputes one segment at a time (its length in units)."""
    return len(segments) + max(segments)
