"""Activations a mixture-of-experts layer saves for its backward, and a rank's memory at its peak: an
approximation, stated term by term.

Per layer and micro-batch on one rank, T = b s / cp tokens of attention (its tp ranks split the heads;
the MoE part splits the tokens over tp, T / tp each, as `distlab.moe.folded_block` does), e bytes per
value (2 for BF16), nothing recomputed unless `savings` says so (below):

- **attention**, grouped-query or multi-head: the norm's input and output T h each, q T a d_h, k and v
  T a_kv d_h each, the attention output T a d_h (the output projection's input), all but the norm's / tp,
  and FlashAttention's log-sum-exp T a fp32 values / tp (Dao 2023); with per-head RMSNorms of q and k
  (`qk_norm`, Qwen3's) also their inputs, the projections' outputs T (a + a_kv) d_h / tp (q and k are then
  the norms' outputs after rotary embedding, new tensors);
- **multi-head latent attention** (DeepSeek-AI 2024, sec. 2.1.1; its dimensions from DeepSeek-V2, Liu et
  al. 2024, arXiv 2405.04434, sec. 2.1): the same norm tensors; the query latent T r_q and its norm's
  output T r_q; the joint key-value latent with the rope key T (r_kv + d_rope) and its norm's output T r_kv;
  then q and k, T a (d_nope + d_rope) each, v T a d_v and the attention output T a d_v, / tp, and the
  log-sum-exp. This is the approximation: a kernel that fuses the up-projections saves less;
- **MoE**: the norm's input and output T h (T / tp h each with sequence parallelism, which Megatron-Core
  requires with tp > 1 and experts: its `TransformerConfig` refuses the one without the other); the router's
  probabilities on the rank's T / tp tokens, E fp32 each (and, under FP8 caching, its own BF16 copy of the
  norm's output, `Savings.router_input`); per routed copy (T / tp tokens x k): the expert's
  input h, its gate and up outputs 2 F_e, the SiLU's output F_e and the product F_e (SwiGLU, unfused; a GELU
  expert saves F_e twice), and the copy's output h as the combine gets it back, with its gate, both kept by
  the product that weights one by the other; the shared experts as a dense gated MLP of width F_s / tp on T
  tokens. These are the terms `moe_block_activations.GENERIC` names: on chapter 6's folded block they are its
  measured bytes less what that implementation saves besides (indices, LayerNorm statistics, the z-loss's
  logits, its copies of the experts' outputs);
- **dense MLP** (the first layers): its input T h (the norm's output) and 4 T f / tp (2 T f / tp ungated).

`savings` (`moe_savings.Savings`) applies DeepSeek-V3's two savings, each an option: recomputing the
RMSNorms and MLA's up-projections in backward (sec. 3.2.3: the norms' outputs and q, k, v not stored) and
caching the linear layers' inputs in FP8 (sec. 3.3.3: 1 byte and a tile scale; the attention output in
12-bit E5M6; the MoE SwiGLU's two inputs in FP8 and its output recomputed).

A rank's peak (`moe_peak_bytes`) adds to its model states (`moe_states`) the activations of the
micro-batches its stage holds (`shape.in_flight`: p - stage under 1F1B) times its layers, and one layer's
dispatch and combine buffers (`moe_states.dispatch_bytes`). It leaves out the temporaries of each op and
of the optimizer step, which chapter 7's dense walk (`peak_layout`) counts. The last stage also holds its
head's: the final norm's input and output and the loss's fp32 softmax over the vocabulary (`head_bytes`),
which chapter 12's whole-stage dry run found missing (2.2 GB of DeepSeek-V3's last stage, 23 % of its
activations).
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.layout import Layout
from distlab.memory.estimate import shape as stages
from distlab.memory.estimate.moe_savings import NONE, Savings
from distlab.memory.estimate.moe_states import dispatch_bytes, stage_states
from distlab.model_shape import ModelShape

LSE_BYTES = 4  # FlashAttention's log-sum-exp, fp32


def attention_bytes(ms: ModelShape, tokens: int, tp: int, e: int = 2, savings: Savings = NONE) -> float:
    """Saved bytes of one layer's attention (module docstring); `tokens` = b s / cp; `savings`: DeepSeek-V3's
    recomputation and FP8 caching (`moe_savings`)."""
    h, a, t = ms.hidden, ms.heads, tokens
    norm = t * h * e + t * h * savings.norm_output(e)
    lse = t * a * LSE_BYTES / tp
    mla = ms.moe.mla if ms.moe is not None else None
    if mla is not None:
        latents = t * (mla.q_rank + mla.kv_rank + mla.qk_rope) * e
        latent_norms = t * (mla.q_rank + mla.kv_rank) * savings.norm_output(e)
        qkv = t * a * (2 * (mla.qk_nope + mla.qk_rope) + mla.v_dim) * savings.up_projection(e) / tp
        out = t * a * mla.v_dim * savings.attention_output(e) / tp
        return norm + latents + latent_norms + qkv + out + lse
    d = (ms.moe.head_dim if ms.moe is not None and ms.moe.head_dim else h // a)
    kv = ms.kv_heads or a
    qk_norm = t * (a + kv) * d * e / tp if ms.moe is not None and ms.moe.qk_norm else 0.0
    return norm + t * (a * d + 2 * kv * d) * e / tp + t * a * d * savings.attention_output(e) / tp + lse \
        + qk_norm


def hidden_bytes(ms: ModelShape, tokens: float, width: float, e: int = 2, savings: Savings = NONE,
                 moe: bool = False) -> float:
    """Saved bytes of one FFN of `width` on `tokens` tokens, its input left out: SwiGLU's gate and up
    outputs and their product (`Savings.swiglu`), or a GELU's input and output (the second layer's)."""
    if ms.gated:
        return tokens * savings.swiglu(e, width, moe)
    return tokens * width * (e + savings.linear_input(e))


def routed_bytes(ms: ModelShape, tokens: int, tp: int, e: int = 2, savings: Savings = NONE) -> float:
    """Saved bytes of one layer's routed experts on one rank: T / tp tokens x k copies, each an FFN of
    width F_e with its input, and the copy's returned output h and its gate, which the combine multiplies
    (balanced routing: the rows a rank's experts receive are the rows it sends)."""
    copies = tokens / tp * ms.moe.top_k
    return copies * (ms.hidden * savings.linear_input(e) + (ms.hidden + 1) * e) \
        + hidden_bytes(ms, copies, ms.moe.expert_ffn, e, savings, moe=True)


def layer_bytes(ms: ModelShape, moe_layer: bool, tokens: int, tp: int, e: int = 2,
                savings: Savings = NONE, sequence_parallel: bool = False) -> float:
    """Saved bytes of one layer and one micro-batch on one rank (module docstring); `sequence_parallel`:
    an MoE layer's RMSNorm runs on the rank's T / tp tokens (Megatron-Core's, which requires sequence
    parallelism with tp > 1 and expert parallelism), not on all T as chapter 6's folded block runs it."""
    norm_tokens = tokens / tp if moe_layer and sequence_parallel else tokens
    out = attention_bytes(ms, tokens, tp, e, savings) + norm_tokens * ms.hidden * (e + savings.norm_output(e))
    if not moe_layer:
        return out + hidden_bytes(ms, tokens, ms.ffn_size / tp, e, savings)
    m = ms.moe
    shared = hidden_bytes(ms, tokens, m.shared_width * m.shared_experts / tp, e, savings, moe=True)
    router = tokens / tp * m.experts * 4 + norm_tokens * ms.hidden * savings.router_input(e)
    return out + router + routed_bytes(ms, tokens, tp, e, savings) + shared


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


def head_bytes(ms: ModelShape, tokens: int, tp: int, e: int = 2, savings: Savings = NONE) -> float:
    """Saved bytes of the last stage's head and loss per micro-batch: the final RMSNorm's input T h, its
    output T h (the output layer's input, kept in BF16: DeepSeek-V3 keeps the output head out of FP8, sec.
    3.3; none when the norms are recomputed) and the cross-entropy's fp32 softmax of the rank's T V / tp
    logits (PyTorch's log-softmax output; Megatron-LM's vocab-parallel loss keeps the same fp32 softmax)."""
    head_input = 0.0 if savings.recompute else e
    return tokens * ms.hidden * (e + head_input) + tokens * ms.vocab / tp * 4


def moe_stage_peaks(ms: ModelShape, layout: Layout, micro_batch: int = 1, microbatches: int | None = None,
                    zero: int = 1, precision: str = "mixed", capacity_factor: float | None = None,
                    savings: Savings = NONE, sequence_parallel: bool | None = None) -> list[MoEPeak]:
    """The peak of one rank of every pipeline stage (module docstring), 1F1B; the last stage also holds its
    head's and loss's saved tensors (`head_bytes`) for its one micro-batch in flight. Parameters as
    `moe_peak_bytes`."""
    tp, cp, pp = layout.size("tp"), layout.size("cp"), layout.size("pp")
    sp = tp > 1 if sequence_parallel is None else sequence_parallel
    tokens = micro_batch * ms.seq // cp
    m = microbatches or pp
    states = stage_states(ms, layout, zero, precision)
    buffers = dispatch_bytes(tokens // tp, ms.moe.top_k, ms.hidden, 2, capacity_factor)
    out, first = [], 0
    for i, n in enumerate(stages.stage_layers(ms.layers, pp)):
        dense = max(0, min(n, ms.moe.dense_layers - first))
        act = dense * layer_bytes(ms, False, tokens, tp, savings=savings) \
            + (n - dense) * layer_bytes(ms, True, tokens, tp, savings=savings, sequence_parallel=sp) \
            + (head_bytes(ms, tokens, tp, savings=savings) if i == pp - 1 else 0.0)
        act *= stages.in_flight("1f1b", i, pp, m, 1)
        out.append(MoEPeak(states[i].model_states_bytes, act, buffers if n > dense else 0.0, i))
        first += n
    return out


def moe_peak_bytes(ms: ModelShape, layout: Layout, micro_batch: int = 1, microbatches: int | None = None,
                   zero: int = 1, precision: str = "mixed", capacity_factor: float | None = None,
                   savings: Savings = NONE, sequence_parallel: bool | None = None) -> MoEPeak:
    """The peak of the rank that holds the most (module docstring, `moe_stage_peaks`), 1F1B; `savings`:
    DeepSeek-V3's recomputation and FP8 activation caching (`moe_savings.Savings`), none by default;
    `sequence_parallel` (`layer_bytes`): by default on where tp > 1, as Megatron-Core requires for MoE with
    tp > 1."""
    peaks = moe_stage_peaks(ms, layout, micro_batch, microbatches, zero, precision, capacity_factor, savings,
                            sequence_parallel)
    return max(peaks, key=lambda p: p.peak_bytes)
