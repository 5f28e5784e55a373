"""Model states per rank of a mixture-of-experts model under parallel folding, and its dispatch buffers.

Attention and the other dense parts split over the layout's tp x cp x dp x pp, the routed experts over
etp x ep x edp x pp on the same ranks (Liu et al. 2025, arXiv 2504.14960; `distlab.expert_fold`). On one
rank of pipeline stage i (its layers as `shape.stage_layers` splits them; the model's first
`dense_layers` are its first layers):

- **dense** (replicated over dp x cp, one gradient reduction group): attention's weights and the
  column-parallel biases / tp, its output bias replicated (chapter 5's Megatron split), MLA's down-
  projections and latent norms and the q/k norms replicated (`moe_shape.attention_replicated`); the two
  norms, the router (h E) and Qwen2-MoE's shared-expert gate replicated; the shared experts and a dense
  layer's MLP / tp (their output bias replicated); the embedding / tp on the first stage (and learned
  positions), the output layer / tp on the last (also when tied, if pp > 1), with the final norm;
- **experts** (replicated over edp only): E / ep routed experts per rank, each / etp (its output bias
  replicated over etp).

Each parameter costs 2 + 2 + K bytes (mixed) or 4 + 4 + 8 (fp32); ZeRO's stage divides the dense part's
states over dp x cp and the experts' over edp (Megatron-Core's distributed optimizer shards the expert
parameters over the expert-data-parallel group, DeepSeek-V3's ZeRO-1 likewise; DeepSeek-AI 2024,
sec. 3.2). `moe_states` reports the pipeline stage whose rank holds the most bytes.

Dispatch and combine buffers (`dispatch_bytes`): a rank routes T tokens to k experts each, so the
all-to-all's send buffer holds T k rows of h values, and so does its receive buffer (balanced routing);
with a capacity factor C the receive side is padded to C T k rows (GShard, Lepikhin et al. 2021), and the
combine's two buffers are the same size: 2 (1 + C) T k h bytes per element in all while a layer's
dispatch and combine are live (C = 1: dropless, as measured on balanced routing).
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.layout import Layout
from distlab.memory.estimate import cost_model, shape
from distlab.model_shape import ModelShape
from distlab.moe_shape import attention_replicated, ffn_params, router_params, shared_params


@dataclass(frozen=True)
class MoEStates:
    """One rank's parameters (dense and routed experts) and model-state bytes, on `stage`, the pipeline
    stage whose rank holds the most."""

    dense_params: float
    expert_params: float
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    stage: int

    @property
    def params(self) -> float:
        return self.dense_params + self.expert_params

    @property
    def model_states_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def _split(total: int, replicated: int, parts: int) -> float:
    """A tensor-parallel split of `total` parameters of which `replicated` stay whole on every rank."""
    return (total - replicated) / parts + replicated


def layer_params(ms: ModelShape, moe_layer: bool, tp: int, ep: int, etp: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters of one layer on one rank (module docstring)."""
    m, h, bias = ms.moe, ms.hidden, ms.bias
    out_bias = h if bias else 0
    dense = _split(ms.attention_params, attention_replicated(m, h, ms.heads, bias), tp) + ms.norm_params
    if not moe_layer:
        return dense + _split(ffn_params(h, ms.ffn_size, ms.gated, bias), out_bias, tp), 0.0
    gate = h if m.shared_gate else 0
    shared = shared_params(m, h, ms.gated, bias)
    dense += router_params(m, h) + gate + _split(shared - gate, m.shared_experts * out_bias, tp)
    experts = m.experts // ep * _split(ms.expert_params, out_bias, etp)
    return dense, experts


def stage_params(ms: ModelShape, layout: Layout, layer_split: tuple[int, ...] | None = None,
                 ends: bool = True) -> list[tuple[float, float]]:
    """(dense, routed-expert) parameters of one rank of each pipeline stage (`ends=False`: the blocks
    alone, without the embeddings and the final norm)."""
    if ms.moe is None:
        raise ValueError("stage_params counts a mixture of experts; give a ModelShape with moe=MoEShape(...)")
    tp, pp = layout.size("tp"), layout.size("pp")
    e = layout.expert_sizes
    split = shape.stage_layers(ms.layers, pp, layer_split)
    h, first = ms.hidden, 0
    out = []
    for i, n in enumerate(split):
        dense_here = max(0, min(n, ms.moe.dense_layers - first))
        d_dense, _ = layer_params(ms, False, tp, e["ep"], e["etp"])
        d_moe, x_moe = layer_params(ms, True, tp, e["ep"], e["etp"])
        dense = dense_here * d_dense + (n - dense_here) * d_moe
        if i == 0 and ends:
            dense += ms.vocab * h / tp + (ms.seq * h if ms.positions else 0)
        if i == pp - 1 and ends:
            dense += (ms.vocab * h / tp if (not ms.tied or pp > 1) else 0) + (2 * h if ms.bias else h)
        out.append((dense, (n - dense_here) * x_moe))
        first += n
    return out


def check_moe_layout(ms: ModelShape, layout: Layout) -> None:
    """The experts must split evenly over ep (and the heads over tp)."""
    e = layout.expert_sizes
    if ms.moe.experts % e["ep"]:
        raise ValueError(f"ep={e['ep']} does not divide experts={ms.moe.experts}; choose ep among "
                         f"{[d for d in range(1, ms.moe.experts + 1) if ms.moe.experts % d == 0]}")
    if ms.heads % layout.size("tp"):
        raise ValueError(f"tp={layout.size('tp')} does not divide heads={ms.heads}; choose a tp that "
                         "divides it")


def stage_states(ms: ModelShape, layout: Layout, zero: int = 0, precision: str = "mixed",
                 layer_split: tuple[int, ...] | None = None, ends: bool = True) -> list[MoEStates]:
    """Model-state bytes of one rank of each pipeline stage (module docstring)."""
    check_moe_layout(ms, layout)
    dp, edp = layout.size("dp") * layout.size("cp"), layout.edp
    out = []
    for i, (dense, experts) in enumerate(stage_params(ms, layout, layer_split, ends)):
        pd, gd, od = cost_model.model_state_bytes(dense, precision, zero, dp)
        pe, ge, oe = cost_model.model_state_bytes(experts, precision, zero, edp)
        out.append(MoEStates(dense, experts, pd + pe, gd + ge, od + oe, i))
    return out


def moe_states(ms: ModelShape, layout: Layout, zero: int = 0, precision: str = "mixed",
               layer_split: tuple[int, ...] | None = None, ends: bool = True) -> MoEStates:
    """Model-state bytes of the rank that holds the most (module docstring); `ends=False` leaves out the
    embeddings and the final norm (a stack of blocks alone)."""
    return max(stage_states(ms, layout, zero, precision, layer_split, ends),
               key=lambda st: st.model_states_bytes)


def dispatch_bytes(tokens: int, top_k: int, hidden: int, bytes_per_element: int = 2,
                   capacity_factor: float | None = None) -> float:
    """The dispatch and combine buffers of one MoE layer on one rank (module docstring): send T k h, receive
    C T k h (C = 1 without a capacity factor), both directions."""
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(f"capacity_factor={capacity_factor!r} must be positive (e.g. 1.25), or None for "
                         "dropless routing")
    c = 1.0 if capacity_factor is None else capacity_factor
    return 2 * (1 + c) * tokens * top_k * hidden * bytes_per_element
