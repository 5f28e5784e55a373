"""A whole MoE layer on the meta device (DeepSeek-V3's: multi-head latent attention, then the MoE half; or
grouped-query attention, Qwen3's, with `gqa_forward`), forward and backward on one rank of the fake world,
with every tensor autograd saves for the backward counted.

Attention is MLA (DeepSeek-AI 2024, sec. 2.1.1): a fused RMSNorm; the query down-projection, its norm and
up-projection; the joint key-value down-projection with the decoupled rope key, its norm and
up-projection; rotary embeddings on the rope parts (Su et al. 2021; the cos and sin tables are buffers of
the model, like weights); then the fused attention kernel and the output projection, heads split over tp.
The fused kernel saves q, k, v, its output and a b x a x s fp32 log-sum-exp, and nothing of s x s (Dao
2023). The dense dry run sends `scaled_dot_product_attention` on meta tensors to the CPU flash kernel's
op (`attention.FusedAttentionOnMeta`), but that op's meta implementation gives the output q's head width:
MLA's v is narrower (128 against 192 for q and k), and the kernels DeepSeek-V3 runs on take it so.
`MLAFlashAttention` therefore saves the same five tensors as that op, with the output v's width, in
the kernels' (b, s, a, d) layout; on equal widths it saves what `FusedAttentionOnMeta` saves, to the byte
(`tests/dryrun/test_dryrun_moe_layer.py`).

Every tp rank runs attention on all T = b s tokens (the heads split, the down-projections and norms whole),
as `moe_activations.attention_bytes` counts it; the MoE half (`moe_rank.moe_forward`) then takes the rank's
T / tp slice of the tokens under sequence parallelism, as `layer_bytes(..., sequence_parallel=True)` counts
it. Nothing is recomputed and nothing is cached in FP8: DeepSeek-V3's savings (`moe_savings`) are not run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.dryrun.fake_world import fake_world
from distlab.dryrun.held import storage_key
from distlab.dryrun.moe_rank import FusedRMSNorm, _attention, _ep_group, _moe_modules, moe_forward
from distlab.dryrun.moe_sequence_parallel import tp_group_ranks
from distlab.layout import Layout
from distlab.model_shape import ModelShape
from distlab.tensor_parallel.comm import reduce_scatter_seq

__all__ = ["MLAFlashAttention", "gqa_forward", "mla_forward", "whole_layer_step"]


class MLAFlashAttention(torch.autograd.Function):
    """Causal fused attention on the meta device for unequal q/k and v head widths, (b, s, a, d) layout:
    saves q, k, v, the output and the fp32 log-sum-exp (b, a, s), as the fused kernels do; no values."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # type: ignore[override]
        b, s, a, _ = q.shape
        out = v.new_empty(b, s, a, v.shape[-1])
        lse = torch.empty(b, a, s, dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        q, k, v, _out, _lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of x (b, s, heads, d_rope) with tables (s, d_rope): saves only the tables."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat([-x2, x1], dim=-1) * sin[:, None]


def mla_forward(attn: nn.ModuleDict, norm: Tensor, x: Tensor, batch: int, tables: tuple[Tensor, Tensor],
                ms: ModelShape) -> Tensor:
    """MLA on the tokens x (b s, h) of `batch` sequences, this rank's heads (module docstring); returns the
    output projection's output (b s, h), partial over tp."""
    m, (cos, sin) = ms.moe.mla, tables
    b, s = batch, x.shape[0] // batch
    xn = FusedRMSNorm.apply(x, norm)
    q = attn["q_up"](FusedRMSNorm.apply(attn["q_down"](xn), attn["q_norm"].weight))
    q = q.view(b, s, -1, m.qk_nope + m.qk_rope)
    latent, k_rope = attn["kv_down"](xn).split([m.kv_rank, m.qk_rope], dim=-1)
    kv = attn["kv_up"](FusedRMSNorm.apply(latent, attn["kv_norm"].weight)).view(b, s, -1, m.qk_nope + m.v_dim)
    k_nope, v = kv.split([m.qk_nope, m.v_dim], dim=-1)
    q_nope, q_rope = q.split([m.qk_nope, m.qk_rope], dim=-1)
    q = torch.cat([q_nope, _rope(q_rope, cos, sin)], dim=-1)
    k_rope = _rope(k_rope.view(b, s, 1, m.qk_rope), cos, sin).expand(-1, -1, k_nope.shape[2], -1)
    out = MLAFlashAttention.apply(q, torch.cat([k_nope, k_rope], dim=-1), v.contiguous())
    return attn["out"](out.reshape(b * s, -1))


def gqa_forward(attn: nn.ModuleDict, norm: Tensor, x: Tensor, batch: int, tables: tuple[Tensor, Tensor],
                ms: ModelShape) -> Tensor:
    """Grouped-query attention on the tokens x (b s, h), this rank's heads: q, k, v projections, the
    per-head RMSNorms of q and k where the shape has them (Qwen3's), rotary embeddings, the fused kernel
    (k and v at their own head count, as FlashAttention takes grouped queries) and the output projection."""
    b, s, d = batch, x.shape[0] // batch, ms.moe.head_dim or ms.hidden // ms.heads
    xn = FusedRMSNorm.apply(x, norm)
    q, k, v = (attn[n](xn).view(b, s, -1, d) for n in ("q", "k", "v"))
    if "q_norm" in attn:
        q, k = FusedRMSNorm.apply(q, attn["q_norm"].weight), FusedRMSNorm.apply(k, attn["k_norm"].weight)
    out = MLAFlashAttention.apply(_rope(q, *tables), _rope(k, *tables), v)
    return attn["o"](out.reshape(b * s, -1))


def _residual(x: Tensor, attn_out: Tensor, tp_group: dist.ProcessGroup | None) -> Tensor:
    """The residual after attention on the rank's tokens: with tp > 1 the output projection's partial sums
    reduce-scattered to the rank's T / tp (a row-parallel layer under sequence parallelism) plus its slice
    of x; with tp = 1 all of it."""
    if tp_group is None:
        return x + attn_out
    tp, mine = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    rows = x.shape[0] // tp
    return x[mine * rows:(mine + 1) * rows] + reduce_scatter_seq(attn_out, tp_group, dim=0)


def _saved_bytes(run, weights: set[int]) -> int:  # type: ignore[no-untyped-def]
    """Bytes of the distinct storages autograd saves while `run()` builds the graph, weights left out."""
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        if storage_key(t) not in weights:
            seen.setdefault(storage_key(t), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = run()
    y.sum().backward()
    return sum(seen.values())


def whole_layer_step(ms: ModelShape, layout: Layout, rank: int = 0, micro_batch: int = 1,
                        dtype: torch.dtype = torch.bfloat16) -> int:
    """The bytes autograd saves for the backward of one whole MoE layer of `ms` (MLA, then the MoE half) on
    rank `rank` of `layout`'s fake world, one micro-batch of `micro_batch` sequences (module docstring)."""
    if ms.moe is None or layout.size("cp") != 1:
        raise ValueError("whole_layer_step runs an MoE layer without context parallelism: give a shape with "
                         "moe=MoEShape(...) and a layout with cp=1")
    tp, ep, k = layout.size("tp"), layout.expert_sizes["ep"], ms.moe.top_k
    tokens = micro_batch * ms.seq
    if tokens % tp or tokens // tp * k % ep:
        raise ValueError(f"b s = {tokens} tokens must split over tp={tp} and their T k / tp copies over "
                         f"ep={ep}; choose another micro_batch")
    with fake_world(rank, layout.world_size):
        groups = (dist.new_group(_ep_group(layout, rank)),
                  dist.new_group(tp_group_ranks(layout, rank)) if tp > 1 else None)
        with torch.device("meta"):
            attn, moe = _attention(ms, tp).to(dtype), _moe_modules(ms, ep, tp, dtype)
            norm = nn.Parameter(torch.ones(ms.hidden, dtype=dtype))
            rope = ms.moe.mla.qk_rope if ms.moe.mla else ms.moe.head_dim or ms.hidden // ms.heads
            tables = (torch.empty(ms.seq, rope, dtype=dtype),) * 2
            x = torch.empty(tokens, ms.hidden, dtype=dtype, requires_grad=True)
        weights = {storage_key(p) for p in [*attn.parameters(), *moe.parameters(), norm, *tables]}
        def run() -> Tensor:
            attend = mla_forward if ms.moe.mla else gqa_forward
            h = _residual(x, attend(attn, norm, x, micro_batch, tables, ms), groups[1])
            return h + moe_forward(moe, h, k, groups, ["layer"])

        return _saved_bytes(run, weights)
