"""The shape of a real decoder block, and how a pipeline splits the blocks, for the memory estimator.

Chapter 7's closed forms count a GPT-3 block: 4 h^2 attention weights and a 4h GELU MLP, 12 h^2 in all.
Models trained since differ in three ways that change both weights and saved activations:

- **grouped-query attention** (Ainslie et al. 2023): `kv_heads` key/value heads shared by the `heads` query
  heads, so K and V are h_kv = h kv_heads / heads wide: attention weights 2 h^2 + 2 h h_kv;
- **an explicit FFN size** f (Llama 3 405B: 53,248 for h = 16,384; Dubey et al. 2024, Table 3);
- **gated MLPs** (SwiGLU, Shazeer 2020): three matrices (gate, up, down), 3 h f weights instead of 2 h f,
  and three s b f tensors saved for backward (gate output, up output, their product) instead of GELU's two.

With those, Llama 3 405B's block is 2 h^2 + 2 h h_kv + 3 h f = 3.188e9 weights, 1.04 % below 12 h^2.

A pipeline of p stages need not split L layers evenly: `stage_layers(L, p)` gives the stages the floor
of L/p and hands the remainder to the middle stages, so the first and last stages, which also carry the
embedding and the output layer, hold fewer (Llama 3: 126 layers on 16 stages, 7 on the first and the last,
8 on the others; Dubey et al. 2024, sec. 3.3.2). An explicit `layer_split` overrides it.
"""

from __future__ import annotations

from collections.abc import Sequence


def kv_width(hidden: int, heads: int, kv_heads: int | None) -> int:
    """h_kv: the width of K (and of V) with `kv_heads` key/value heads (None: multi-head attention)."""
    return hidden if kv_heads is None else hidden // heads * kv_heads


def block_weights(hidden: int, heads: int, kv_heads: int | None = None, ffn: int | None = None,
                  gated: bool = False) -> int:
    """Matrix weights of one block: attention 2 h^2 + 2 h h_kv, MLP (3 if gated else 2) h f; f = 4h unless
    given. For a GPT-3 block (kv_heads = heads, f = 4h, not gated) this is 12 h^2."""
    h, f = hidden, ffn or 4 * hidden
    return 2 * h * h + 2 * h * kv_width(hidden, heads, kv_heads) + (3 if gated else 2) * h * f


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
