"""One rank of a published MoE layout on the fake process group: its modules on the meta device and one MoE
layer's dispatch and combine, counted from what the code did.

`stage_modules(shape, layout, stage)` builds the blocks one rank of pipeline stage `stage` holds, as
modules with shapes and no data (the meta device): multi-head latent attention's projections
(DeepSeek-AI 2024, sec. 2.1.1: the query down- and up-projection with its norm, the joint key-value
down-projection with the rope key, its norm and up-projection, the output projection; grouped-query
attention's q, k, v, o otherwise), split over tp as chapter 5 splits them, the two RMSNorms, and for an
MoE layer the router, the shared experts (/ tp) and the E / ep routed SwiGLU experts this rank holds;
the embedding on the first stage, the final norm and the output layer on the last.

`moe_layer_step(...)` makes this process one rank of the fake world (`fake_world`), runs the MoE half of
one layer (a fused RMSNorm, the router, the shared experts, dispatch, the rank's experts and combine) on
the meta device, forward and backward, with force-balanced routing (each
token's k copies spread evenly over the ep ranks, as the Megatron-Bridge benchmarks force-balance them),
and returns what `distlab.comm_log` recorded: the all-to-alls' buffers, which chapter 9's cost model
(`plan.moe_cost`) prices as 4 x T k h b bytes per layer and micro-batch, what autograd saved for the
backward of the experts and of the combine (each returned copy weighted by its gate), which chapter 7's
`moe_activations.routed_bytes` counts, and what it saved for the whole MoE half, which `layer_bytes` less
`attention_bytes` counts with `sequence_parallel=True` (within 1 %: the estimate leaves out the norm's fp32
reciprocal RMS and the top-k's indices). With tp > 1 the layer runs as Megatron-Core runs it under the
sequence parallelism it requires: the norm, router and routed copies on the rank's T / tp tokens, the shared
expert F_s / tp wide on all T, gathered (`moe_sequence_parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import comm_log
from distlab.dryrun.fake_world import fake_world
from distlab.dryrun.held import storage_key
from distlab.dryrun.moe_sequence_parallel import sequence_parallel_swiglu, tp_group_ranks
from distlab.layout import Layout
from distlab.memory.estimate import shape as stages
from distlab.model_shape import ModelShape
from distlab.moe.expert_parallel import all_to_all


class SwiGLU(nn.Module):
    """An expert or an MLP: down(silu(gate(x)) * up(x)), no biases (Shazeer 2020)."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, width, bias=False)
        self.up = nn.Linear(hidden, width, bias=False)
        self.down = nn.Linear(width, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


def _attention(ms: ModelShape, tp: int) -> nn.Module:
    """The projections of one layer's attention on one of tp ranks (module docstring)."""
    h, a, m = ms.hidden, ms.heads // tp, ms.moe
    if m.mla is not None:
        x = m.mla
        return nn.ModuleDict({
            "q_down": nn.Linear(h, x.q_rank, bias=False), "q_norm": nn.RMSNorm(x.q_rank),
            "q_up": nn.Linear(x.q_rank, a * (x.qk_nope + x.qk_rope), bias=False),
            "kv_down": nn.Linear(h, x.kv_rank + x.qk_rope, bias=False), "kv_norm": nn.RMSNorm(x.kv_rank),
            "kv_up": nn.Linear(x.kv_rank, a * (x.qk_nope + x.v_dim), bias=False),
            "out": nn.Linear(a * x.v_dim, h, bias=False)})
    d, kv = m.head_dim or h // ms.heads, (ms.kv_heads or ms.heads) // tp
    parts = {"q": nn.Linear(h, a * d, bias=m.qkv_bias), "k": nn.Linear(h, kv * d, bias=m.qkv_bias),
             "v": nn.Linear(h, kv * d, bias=m.qkv_bias), "o": nn.Linear(a * d, h, bias=False)}
    if m.qk_norm:
        parts |= {"q_norm": nn.RMSNorm(d), "k_norm": nn.RMSNorm(d)}
    return nn.ModuleDict(parts)


def _layer(ms: ModelShape, moe: bool, tp: int, ep: int) -> nn.Module:
    h, m = ms.hidden, ms.moe
    parts: dict[str, nn.Module] = {"attn_norm": nn.RMSNorm(h), "attn": _attention(ms, tp),
                                   "ffn_norm": nn.RMSNorm(h)}
    if not moe:
        parts["mlp"] = SwiGLU(h, ms.ffn_size // tp)
        return nn.ModuleDict(parts)
    parts["router"] = nn.Linear(h, m.experts, bias=False)
    parts["shared"] = nn.ModuleList(SwiGLU(h, m.shared_width // tp) for _ in range(m.shared_experts))
    if m.shared_gate:
        parts["shared_gate"] = nn.Linear(h, 1, bias=False)
    parts["experts"] = nn.ModuleList(SwiGLU(h, m.expert_ffn) for _ in range(m.experts // ep))
    return nn.ModuleDict(parts)


def stage_modules(ms: ModelShape, layout: Layout, stage: int) -> nn.ModuleDict:
    """The modules one rank of pipeline stage `stage` holds, on the meta device (module docstring)."""
    if ms.moe is None or ms.bias or not ms.gated:
        raise ValueError("stage_modules builds a published MoE shape: moe=MoEShape(...), gated=True, "
                         "bias=False (PublishedShape.model_shape() gives one)")
    tp, pp, ep = layout.size("tp"), layout.size("pp"), layout.expert_sizes["ep"]
    if layout.expert_sizes["etp"] != 1:
        raise ValueError("stage_modules splits experts over ep only; give ExpertFold(etp=1)")
    split = stages.stage_layers(ms.layers, pp)
    first = sum(split[:stage])
    with torch.device("meta"):
        layers = nn.ModuleList(_layer(ms, first + i >= ms.moe.dense_layers, tp, ep)
                               for i in range(split[stage]))
        out = nn.ModuleDict({"layers": layers})
        if stage == 0:
            out["embedding"] = nn.Embedding(ms.vocab // tp, ms.hidden)
        if stage == pp - 1:
            out["final_norm"] = nn.RMSNorm(ms.hidden)
            out["head"] = nn.Linear(ms.hidden, ms.vocab // tp, bias=False)
    return out


def split_counts(module: nn.Module) -> tuple[int, int]:
    """(dense, routed-expert) parameters of `module`, counted on its tensors."""
    experts = sum(p.numel() for name, p in module.named_parameters() if ".experts." in name)
    return sum(p.numel() for p in module.parameters()) - experts, experts


@dataclass(frozen=True)
class MoELayerTraffic:
    """One MoE layer's forward and backward on one rank: the all-to-all buffers comm_log recorded and the
    bytes autograd saved, each storage once, parameters left out."""

    calls: int
    nbytes: int  # the sum of the whole buffers B
    sent_bytes: float  # what left the rank ((p - 1)/p of each buffer, its own chunk kept)
    group_size: int
    saved_bytes: int  # saved for the backward of the routed experts and the combine
    layer_saved_bytes: int  # saved for the backward of the whole MoE half of the layer (norm to combine)


class FusedRMSNorm(torch.autograd.Function):
    """RMSNorm (Zhang & Sennrich 2019) as a fused kernel runs it: it saves its input and the fp32
    reciprocal root mean square of each token, and no intermediate (Megatron-Core's and Transformer
    Engine's RMSNorm save the same two)."""

    EPS = 1e-6

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:  # type: ignore[override]
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # fp32 at least, as the kernels compute
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + FusedRMSNorm.EPS)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        gy = grad.to(rstd.dtype) * weight.to(rstd.dtype)
        dx = rstd * (gy - xhat * (gy * xhat).mean(-1, keepdim=True))
        dw = (grad.to(rstd.dtype) * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype)


def _ep_group(layout: Layout, rank: int) -> list[int]:
    """The ep group of global `rank`: ep consecutive ranks (Megatron-Core's "tp-ep-dp-pp" with etp = 1)."""
    ep = layout.expert_sizes["ep"]
    start = rank // ep * ep
    return list(range(start, start + ep))


def _moe_modules(ms: ModelShape, ep: int, tp: int, dtype: torch.dtype) -> nn.ModuleDict:
    """On the meta device: the MoE half of a layer that one rank runs: its norm's weight, the router, the
    shared experts (/ tp, one SwiGLU of their summed width) and its E / ep routed experts."""
    h, m = ms.hidden, ms.moe
    parts = nn.ModuleDict({"router": nn.Linear(h, m.experts, bias=False),
                           "experts": nn.ModuleList(SwiGLU(h, m.expert_ffn) for _ in range(m.experts // ep))})
    if m.shared_experts:
        parts["shared"] = SwiGLU(h, m.shared_width * m.shared_experts // tp)
    parts.register_parameter("norm", nn.Parameter(torch.ones(h)))
    return parts.to(dtype)


def moe_forward(parts: nn.ModuleDict, x: Tensor, k: int, groups: tuple, region: list[str]) -> Tensor:
    """The MoE half of a layer on the rank's tokens `x` (T, h): RMSNorm, router, dispatch over `groups[0]`
    (ep) with force-balanced routing, the rank's experts, combine, the shared expert (sequence-parallel
    over `groups[1]`, the tp group, or None for tp = 1); "experts" is pushed on `region` around the experts
    and the combine. Returns the MoE output, without the residual."""
    group, tp_group = groups
    tokens, h = x.shape
    splits = [tokens * k // dist.get_world_size(group)] * dist.get_world_size(group)
    xn = FusedRMSNorm.apply(x, parts.norm)
    gates = torch.softmax(parts["router"](xn).float(), dim=-1).topk(k, dim=-1).values
    got = all_to_all(xn.repeat_interleave(k, dim=0), splits, splits, group)
    chunks = got.view(len(parts["experts"]), -1, h)
    region.append("experts")
    out = torch.cat([e(chunks[i]) for i, e in enumerate(parts["experts"])])
    back = all_to_all(out, splits, splits, group)
    # the combine, each copy weighted by its gate
    y = (back.view(tokens, k, h) * gates.to(x.dtype).unsqueeze(-1)).sum(1)
    region.pop()
    if "shared" in parts:
        y = y + (parts["shared"](xn) if tp_group is None
                 else sequence_parallel_swiglu(xn, parts["shared"], tp_group))
    return y


def moe_layer_step(ms: ModelShape, layout: Layout, rank: int = 0, micro_batch: int = 1,
                   dtype: torch.dtype = torch.bfloat16) -> MoELayerTraffic:
    """The MoE half of one layer of `ms` (its RMSNorm, router, shared and routed experts, dispatch and
    combine) on rank `rank` of `layout`'s fake world, forward and backward (module docstring). T =
    micro_batch s / (tp cp) tokens; each of the ep ranks receives T k / ep rows."""
    ep, k, h = layout.expert_sizes["ep"], ms.moe.top_k, ms.hidden
    tokens = micro_batch * ms.seq // (layout.size("tp") * layout.size("cp"))
    if tokens * k % ep:
        raise ValueError(f"T k = {tokens * k} rows do not spread evenly over ep={ep}; choose a micro-batch "
                         "whose tokens x top_k ep divides")
    with fake_world(rank, layout.world_size):
        group = dist.new_group(_ep_group(layout, rank))
        tp_group = dist.new_group(tp_group_ranks(layout, rank)) if layout.size("tp") > 1 else None
        with torch.device("meta"):
            parts = _moe_modules(ms, ep, layout.size("tp"), dtype)
            x = torch.empty(tokens, h, dtype=dtype, requires_grad=True)
        weights = {storage_key(p) for p in parts.parameters()}
        saved: dict[str, dict[int, int]] = {"layer": {}, "experts": {}}
        region = ["layer"]

        def pack(t: Tensor) -> Tensor:
            if storage_key(t) not in weights:
                for name in {"layer", region[-1]}:
                    saved[name].setdefault(storage_key(t), t.untyped_storage().nbytes())
            return t

        with comm_log() as log:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = moe_forward(parts, x, k, (group, tp_group), region)
            y.sum().backward()
        records = [r for r in log.records if r.op == "all_to_all"]
    return MoELayerTraffic(len(records), sum(r.nbytes for r in records), sum(r.sent_bytes for r in records),
                           ep, sum(saved["experts"].values()), sum(saved["layer"].values()))
