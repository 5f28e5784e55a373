"""Activations a mixture-of-experts layer saves for its backward, and a rank's memory at its peak: an
approximation, stated term by term.

Per layer and micro-batch on one rank, T = b s / cp tokens of attention (its tp ranks split the heads;
the MoE part splits the tokens over tp, T / tp each, as `distlab.moe.folded_block` does), e bytes per
value (2 for BF16), nothing recomputed:

- **attention**, grouped-query or multi-head: the norm's input and output T h each, q T a d_h, k and v
  T a_kv d_h each, the attention output T a d_h (the output projection's input), all but the norm's / tp,
  and FlashAttention's log-sum-exp T a fp32 values / tp (Dao 2023);
- **multi-head latent attention** (DeepSeek-AI 2024, sec. 2.1.1; its dimensions from DeepSeek-V2, Liu et
  al. 2024, arXiv 2405.04434, sec. 2.1): the same norm tensors; the query latent T r_q and its norm's
  output T r_q; the joint key-value latent with the rope key T (r_kv + d_rope) and its norm's output T r_kv;
  then q and k, T a (d_nope + d_rope) each, v T a d_v and the attention output T a d_v, / tp, and the
  log-sum-exp. This is the approximation: a kernel that fuses the up-projections (or DeepSeek-V3's
  recomputation of the norms and the up-projections, sec. 3.2.3) saves less, and that is not counted;
- **MoE**: the norm's input and output T h; the router's probabilities on the rank's T / tp tokens, E
  fp32 each; per routed copy (T / tp tokens x k): the expert's input h, its gate and up outputs 2 F_e and
  their product F_e (SwiGLU; a GELU expert saves F_e twice), and the copy's output h as the combine gets
  it back, with its gate, both kept by the product that weights one by the other; the shared experts as
  a dense gated MLP of width F_s / tp on T tokens. These are the terms `moe_block_activations.GENERIC`
  names: on chapter 6's folded block they are its measured bytes less what that implementation saves
  besides (indices, LayerNorm statistics, the z-loss's logits, its copies of the experts' outputs);
- **dense MLP** (the first layers): its input T h and 3 T f / tp (2 T f / tp ungated).

A rank's peak (`moe_peak_bytes`) adds to its model states (`moe_states`) the activations of the
micro-batches its stage holds (`shape.in_flight`: p - stage under 1F1B) times its layers, and one layer's
dispatch and combine buffers (`moe_states.dispatch_bytes`). It leaves out the temporaries of each op and
of the optimizer step, which chapter 7's dense walk (`peak_layout`) counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.layout import Layout
from distlab.memory.estimate import shape as stages
from distlab.memory.estimate.moe_states import dispatch_bytes, stage_states
from distlab.model_shape import ModelShape

LSE_BYTES = 4  # FlashAttention's log-sum-exp, fp32


def attention_bytes(ms: ModelShape, tokens: int, tp: int, e: int = 2) -> float:
    """Saved bytes of one layer's attention (module docstring); `tokens` = b s / cp."""
    h, a, t = ms.hidden, ms.heads, tokens
    norm = 2 * t * h * e
    lse = t * a * LSE_BYTES / tp
    mla = ms.moe.mla if ms.moe is not None else None
    if mla is not None:
        latents = t * (2 * mla.q_rank + 2 * mla.kv_rank + mla.qk_rope) * e
        heads = t * a * (2 * (mla.qk_nope + mla.qk_rope) + 2 * mla.v_dim) * e / tp
        return norm + latents + heads + lse
    d = (ms.moe.head_dim if ms.moe is not None and ms.moe.head_dim else h // a)
    kv = ms.kv_heads or a
    return norm + t * (2 * a * d + 2 * kv * d) * e / tp + lse


def ffn_bytes(ms: ModelShape, tokens: float, width: float, e: int = 2) -> float:
    """Saved bytes of one FFN of `width` on `tokens` tokens: its input and (4 gated, else 2) x width."""
    return tokens * (ms.hidden + (4 if ms.gated else 2) * width) * e


def routed_bytes(ms: ModelShape, tokens: int, tp: int, e: int = 2) -> float:
    """Saved bytes of one layer's routed experts on one rank: T / tp tokens x k copies, each an FFN of
    width F_e, and the copy's returned output h and its gate, which the combine multiplies (balanced
    routing: the rows a rank's experts receive are the rows it sends)."""
    copies = tokens / tp * ms.moe.top_k
    return ffn_bytes(ms, copies, ms.moe.expert_ffn, e) + copies * (ms.hidden + 1) * e


def layer_bytes(ms: ModelShape, moe_layer: bool, tokens: int, tp: int, e: int = 2) -> float:
    """Saved bytes of one layer and one micro-batch on one rank (module docstring)."""
    out = attention_bytes(ms, tokens, tp, e) + 2 * tokens * ms.hidden * e
    if not moe_layer:
        return out + ffn_bytes(ms, tokens, ms.ffn_size / tp, e) - tokens * ms.hidden * e
    m = ms.moe
    routed = routed_bytes(ms, tokens, tp, e)
    shared = ffn_bytes(ms, tokens, m.shared_width * m.shared_experts / tp, e) - tokens * ms.hidden * e \
        if m.shared_experts else 0.0
    return out + tokens / tp * m.experts * 4 + routed + shared


@dataclass(frozen=True)
class MoEPeak:
    """A rank's peak bytes (approximation, module docstring) and its parts, on pipeline stage `stage`."""

    model_states: float
    activations: float
    dispatch: float
    stage: int

    @property
    def peak_bytes(self) -> float:
        return self.model_states + self.activations + self.dispatch


def moe_peak_bytes(ms: ModelShape, layout: Layout, micro_batch: int = 1, microbatches: int | None = None,
                   zero: int = 1, precision: str = "mixed", capacity_factor: float | None = None) -> MoEPeak:
    """The peak of the rank that holds the most (module docstring), 1F1B."""
    tp, cp, pp = layout.size("tp"), layout.size("cp"), layout.size("pp")
    tokens = micro_batch * ms.seq // cp
    m = microbatches or pp
    states = stage_states(ms, layout, zero, precision)
    buffers = dispatch_bytes(tokens // tp, ms.moe.top_k, ms.hidden, 2, capacity_factor)
    best, first = None, 0
    for i, n in enumerate(stages.stage_layers(ms.layers, pp)):
        dense = max(0, min(n, ms.moe.dense_layers - first))
        act = dense * layer_bytes(ms, False, tokens, tp) + (n - dense) * layer_bytes(ms, True, tokens, tp)
        act *= stages.in_flight("1f1b", i, pp, m, 1)
        peak = MoEPeak(states[i].model_states_bytes, act, buffers if n > dense else 0.0, i)
        if best is None or peak.peak_bytes > best.peak_bytes:
            best = peak
        first += n
    return best
