"""The mixture-of-experts part of a model shape, and the counts that follow from it: the one home of the
parameter counts of an MoE transformer (`ModelShape(moe=MoEShape(...))` counts through here).

An MoE decoder (GShard, Lepikhin et al. 2021; DeepSeek-AI 2024, arXiv 2412.19437, sec. 2) replaces the
MLP of its blocks, except the first `dense_layers`, by a router of h E weights, E routed experts of
(3 if gated else 2) h F_e weights of which each token visits `top_k`, and `shared_experts` always-on
experts of width F_s each (a sigmoid gate of h weights on them in Qwen2-MoE). The dense layers keep the
model's own MLP (`ModelShape.ffn`).

Attention is the model's (`ModelShape`: multi-head or grouped-query, h_kv = kv_heads d_h), with the
options the published MoE models have: a head size `head_dim` other than hidden / heads (Qwen3), q, k, v
biases (`qkv_bias`, Qwen2) and RMSNorms on each head's queries and keys (`qk_norm`, Qwen3), or multi-head
latent attention (`mla`, DeepSeek-AI 2024 sec. 2.1.1; its dimensions introduced in DeepSeek-V2,
arXiv 2405.04434, sec. 2.1): queries through a rank-r_q bottleneck, keys and values through a joint
rank-r_kv latent, plus a shared rope key of d_rope:

    h r_q + r_q + r_q a (d_nope + d_rope) + h (r_kv + d_rope) + r_kv + r_kv a (d_nope + d_v) + a d_v h

(the two latent RMSNorms are the lone r_q and r_kv). Active parameters are the total less the routed
experts a token does not visit, (E - k) per MoE layer; the embeddings count as active, as DeepSeek-AI
count them (36.7B "including 0.9B for Embedding and 0.9B for the output Head").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention's sizes (DeepSeek-AI 2024, sec. 2.1.1; DeepSeek-V2, arXiv 2405.04434,
    sec. 2.1): query and joint key-value latent ranks, and per head the no-rope and rope query/key dims and
    the value dim."""

    q_rank: int
    kv_rank: int
    qk_nope: int
    qk_rope: int
    v_dim: int

    def params(self, hidden: int, heads: int) -> int:
        """Attention parameters of one layer (module docstring), latent norms included."""
        h, a = hidden, heads
        return (h * self.q_rank + self.q_rank + self.q_rank * a * (self.qk_nope + self.qk_rope)
                + h * (self.kv_rank + self.qk_rope) + self.kv_rank
                + self.kv_rank * a * (self.qk_nope + self.v_dim) + a * self.v_dim * h)


def _positive(name: str, value: object, zero: bool = False) -> None:
    low = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r} must be a{' non-negative' if zero else ' positive'} integer, "
                         f"e.g. {name}={max(low, 1) * 8}")


@dataclass(frozen=True, kw_only=True)
class MoEShape:
    """`experts` routed experts of FFN width `expert_ffn`, `top_k` per token, `shared_experts` of width
    `shared_ffn` (None: expert_ffn; `shared_gate`: Qwen2-MoE's h-weight gate), the first `dense_layers`
    blocks dense; and the attention options of the published MoE models (module docstring)."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int | None = None
    shared_gate: bool = False
    dense_layers: int = 0
    head_dim: int | None = None  # None: hidden / heads
    qkv_bias: bool = False
    qk_norm: bool = False
    mla: MLA | None = None

    def __post_init__(self) -> None:
        for name in ("experts", "top_k", "expert_ffn"):
            _positive(name, getattr(self, name))
        for name in ("shared_experts", "dense_layers"):
            _positive(name, getattr(self, name), zero=True)
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}; a token visits at most "
                             "every expert once: choose top_k <= experts")
        for name in ("shared_ffn", "head_dim"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))

    @property
    def shared_width(self) -> int:
        """F_s, one shared expert's width."""
        return self.shared_ffn or self.expert_ffn


def check_layers(moe: MoEShape, layers: int) -> None:
    """The dense first layers must leave at least one MoE layer."""
    if moe.dense_layers >= layers:
        raise ValueError(f"dense_layers={moe.dense_layers} leaves no MoE layer of layers={layers}; choose "
                         f"dense_layers < {layers}")


def attention_params(moe: MoEShape, hidden: int, heads: int, kv_heads: int | None, bias: bool) -> int:
    """One layer's attention parameters (module docstring); with `bias` the output projection's too."""
    if moe.mla is not None:
        return moe.mla.params(hidden, heads)
    d = moe.head_dim or hidden // heads
    kv = heads if kv_heads is None else kv_heads
    weights = 2 * hidden * heads * d + 2 * hidden * kv * d
    biases = (heads + 2 * kv) * d if (moe.qkv_bias or bias) else 0
    return weights + biases + (hidden if bias else 0) + (2 * d if moe.qk_norm else 0)


def attention_replicated(moe: MoEShape, hidden: int, heads: int, bias: bool) -> int:
    """The part of one layer's attention that tensor parallelism does not split: MLA's down-projections
    and latent norms (every tp rank needs the whole latent), the q/k norms, the output projection's bias."""
    out = hidden if bias else 0
    if moe.mla is not None:
        m = moe.mla
        return out + hidden * m.q_rank + m.q_rank + hidden * (m.kv_rank + m.qk_rope) + m.kv_rank
    return out + (2 * (moe.head_dim or hidden // heads) if moe.qk_norm else 0)


def ffn_params(hidden: int, width: int, gated: bool, bias: bool) -> int:
    """One FFN (an expert, a shared expert or a dense MLP): (3 if gated else 2) h f, and its biases."""
    return (3 if gated else 2) * hidden * width + ((2 if gated else 1) * width + hidden if bias else 0)


def expert_params(moe: MoEShape, hidden: int, gated: bool, bias: bool) -> int:
    """One routed expert's parameters."""
    return ffn_params(hidden, moe.expert_ffn, gated, bias)


def shared_params(moe: MoEShape, hidden: int, gated: bool, bias: bool) -> int:
    """One MoE layer's shared experts and their gate."""
    return (moe.shared_experts * ffn_params(hidden, moe.shared_width, gated, bias)
            + (hidden if moe.shared_gate else 0))


def router_params(moe: MoEShape, hidden: int) -> int:
    """The router's h E weights (no bias, as `distlab.moe.gating.Router`)."""
    return hidden * moe.experts
