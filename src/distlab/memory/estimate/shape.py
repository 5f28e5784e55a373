"""How a pipeline splits the blocks, and the saved tensors of a block's shape, for the memory estimator.

The block's shape and its counts (grouped-query attention, an explicit FFN size, gated MLPs; `kv_width`,
`block_weights`) live in `distlab.model_shape`, the course's one model shape; they are importable from here
too, where chapter 7 first wrote them. A gated MLP (SwiGLU, Shazeer 2020) also saves three s b f tensors
for backward (gate output, up output, their product) instead of GELU's two (`swap_block_terms`).

A pipeline of p stages need not split L layers evenly: `stage_layers(L, p)` gives the stages the floor
of L/p and hands the remainder to the middle stages, so the first and last stages, which also carry the
embedding and the output layer, hold fewer (Llama 3: 126 layers on 16 stages, 7 on the first and the last,
8 on the others; Dubey et al. 2024, sec. 3.3.2). An explicit `layer_split` overrides it.
"""

from __future__ import annotations

from collections.abc import Sequence

from distlab.model_shape import block_weights, kv_width

__all__ = ["block_weights", "in_flight", "kv_width", "stage_layers", "swap_block_terms"]


def stage_layers(layers: int, pp: int, split: Sequence[int] | None = None) -> tuple[int, ...]:
    """Layers per pipeline stage: `split` if given (checked), else floor(L/p) each with the remainder on the
    middle stages first (module docstring). Raises a ValueError naming the parameter and the fix."""
    if split is not None:
        split = tuple(split)
        if len(split) != pp or sum(split) != layers or min(split) < 1:
            raise ValueError(f"layer_split={list(split)} must give {pp} stages (pp={pp}) of at least one "
                             f"layer each, summing to layers={layers}; e.g. {list(stage_layers(layers, pp))}")
        return split
    if pp > layers:
        raise ValueError(f"pp={pp} exceeds layers={layers}: every pipeline stage needs at least one layer; "
                         f"choose pp <= {layers}")
    base, extra = divmod(layers, pp)
    order = _middle_first(pp)
    bonus = set(order[:extra])
    return tuple(base + (i in bonus) for i in range(pp))


def _middle_first(pp: int) -> list[int]:
    """Stage indices, the middle ones first, then the last stage, then the first."""
    inner = sorted(range(1, pp - 1), key=lambda i: (abs(2 * i - (pp - 1)), i))
    return inner + ([pp - 1] if pp > 1 else []) + [0]


def in_flight(schedule: str, stage: int, pp: int, m: int, v: int, rounds: int | None = None) -> float:
    """Micro-batches of the stage's layers whose activations stage `stage` holds at its peak: all m for
    GPipe, min(m, p - stage) for 1F1B, and for the interleaved schedule ((v - 1) N + 2 (p - 1 - stage) + 1)
    chunks of 1/v of the stage's layers, N the micro-batches of each round through the chunks: N = p in
    Megatron-LM, p v + p - 1 chunks on the first stage (Narayanan et al. 2021, sec. 2.2; Korthikanti et al.
    2022, sec. 4.2.3); Llama 3 lets N be smaller (Dubey et al. 2024, sec. 3.3.2, Figure 6)."""
    if pp == 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(m, pp - stage))
    n = pp if rounds is None else rounds
    return ((v - 1) * n + 2 * (pp - 1 - stage) + 1) / v


Terms = dict[str, tuple[float, bool]]


def swap_block_terms(terms: Terms, s: int, b: int, hidden: int, heads: int, kv_heads: int | None,
                     ffn: int | None, gated: bool, e: int) -> Terms:
    """Korthikanti et al.'s saved tensors of one block (`cost_model.layer_activation_terms`) with the shape's
    own widths: q, k, v as s b (h + 2 h_kv) e; the MLP's saved tensors as 2 s b f e (GELU input and the
    output layer's input) or, gated, 3 s b f e (gate output, up output, their product)."""
    out = dict(terms)
    f = ffn or 4 * hidden
    out["q, k, v"] = (s * b * (hidden + 2 * kv_width(hidden, heads, kv_heads)) * e, True)
    out.pop("gelu input", None)
    out.pop("mlp output-layer input", None)
    if gated:
        out["gate, up outputs"] = (2 * s * b * f * e, True)
        out["mlp output-layer input"] = (s * b * f * e, True)
    else:
        out["gelu input"] = (s * b * f * e, True)
        out["mlp output-layer input"] = (s * b * f * e, True)
    return out
