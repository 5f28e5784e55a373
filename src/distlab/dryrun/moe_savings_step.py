"""DeepSeek-V3's two activation savings run on the meta device, for a whole pipeline stage (`moe_step`).

**FP8 activation caching** (DeepSeek-AI 2024, sec. 3.3.3) is a `torch.autograd.graph.saved_tensors_hooks`
pair (`CachedSaves`): a tensor saved by a linear layer that runs in FP8 is packed to `torch.float8_e4m3fn`
with one fp32 scale per 1 x 128 tile (sec. 3.3.2), once per storage however many layers save it (the
norm's output feeds q's and kv's down-projections: one FP8 copy), and unpacked to BF16 for the backward.
Which layer saves in which form is a rule pushed around each `nn.Linear` by module hooks (`mark_rules`):
"fp8" for every linear layer but two; "bf16" for the router and the output layer, which DeepSeek-V3 keeps
in their original precision (sec. 3.3.1: the embedding, the output head, the MoE gating modules, the
norms and attention); "e5m6" for the output projection, whose input, the attention output, is cached in a
12-bit E5M6 format that attention's backward reads too (sec. 3.3.3). torch has no 12-bit dtype, so that
copy is a uint8 storage of 1.5 bytes a value (the bytes, not the values). A tensor saved only by other
ops (attention, the norms, the combine) stays as it is; one also saved by a BF16 layer is kept in BF16
beside its FP8 copy. The MoE's SwiGLU (`SwiGLUFromInputs`) saves its two inputs, the gate and up
projections' outputs, in FP8 and recomputes its product for the down-projection's backward.

**Recomputation** (sec. 3.2.3) is autograd's reentrant checkpoint (`torch.utils.checkpoint`), which runs a
region without saving and saves only its inputs: the attention norm with the two down-projections (from
the layer's input), the latents' norms with the up-projections, rotary embeddings and the attention kernel
(from the two latents), the MoE norm with the router and the shared expert's gate and up projections, a
dense layer's norm with its gate and up projections, and the final norm with the output layer. The kernel
is inside its region because its backward needs q, k and v, which are the up-projections' outputs: what
DeepSeek-V3 drops. A checkpoint cannot keep an output of a region's op (FlashAttention's log-sum-exp)
while it recomputes the rest, so the kernel runs again in backward and its T a fp32 log-sum-exp values are
not held, where DeepSeek-V3 keeps them: 2 MB a layer and micro-batch, the one difference from the estimate
besides the norms' fp32 RMS, which the recomputed norms no longer hold either.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from distlab.dryrun.held import storage_key
from distlab.dryrun.moe_layer import MLAFlashAttention, _rope
from distlab.dryrun.moe_rank import FusedRMSNorm
from distlab.memory.estimate.moe_savings import Savings
from distlab.model_shape import ModelShape
from distlab.moe.expert_parallel import all_to_all

__all__ = ["CachedSaves", "SwiGLUFromInputs", "mark_rules", "mla_attention", "moe_half", "dense_ffn", "head"]

TILE = 128  # DeepSeek-V3's 1 x 128 activation tiles, one fp32 scale each (sec. 3.3.2)
E4M3_MAX = 448.0


def _fp8(t: Tensor) -> tuple[Tensor, Tensor]:
    """`t` in float8_e4m3fn with one fp32 scale per 1 x 128 tile of its last dim."""
    tiles = t.float().unflatten(-1, (-1, TILE))
    scale = tiles.abs().amax(-1, keepdim=True) / E4M3_MAX
    return (tiles / scale).to(torch.float8_e4m3fn), scale


def _view(t: Tensor) -> tuple:
    return storage_key(t), t.storage_offset(), tuple(t.shape), t.stride()


class CachedSaves:
    """The pack and unpack hooks of the saved tensors, and their bytes (module docstring): each view of a
    storage cached once per form, each storage's own bytes once. `rules` is the stack `mark_rules` pushes
    on; `weights` are storages left out."""

    def __init__(self, weights: set[int], fp8: bool, rules: list[str]) -> None:
        self.weights, self.fp8, self.rules = weights, fp8, rules
        self.forms: dict[int, dict[str, dict[tuple, tuple[Tensor, ...]]]] = {}
        self.plain: dict[int, int] = {}
        self.alive: list[Tensor] = []  # packed tensors, held so that no storage identity is reused

    def pack(self, t: Tensor) -> object:
        key = storage_key(t)
        if key in self.weights:
            return t
        rule = self.rules[-1] if self.fp8 and self.rules else "keep"
        self.plain.setdefault(key, t.untyped_storage().nbytes())
        self.alive.append(t)
        forms = self.forms.setdefault(key, {})
        if rule == "fp8" and t.shape[-1] % TILE == 0:
            cached = forms.setdefault(rule, {}).setdefault(_view(t), _fp8(t))
            return (cached, t.dtype)
        if rule == "e5m6":
            forms.setdefault(rule, {}).setdefault(_view(t), (torch.empty(
                math.ceil(1.5 * t.numel()), dtype=torch.uint8, device=t.device),))
        else:
            forms.setdefault("bf16" if rule == "bf16" else "keep", {})
        return t

    @staticmethod
    def unpack(packed: object) -> Tensor:
        if isinstance(packed, Tensor):
            return packed
        (q, scale), dtype = packed
        return (q.float() * scale).flatten(-2).to(dtype)

    @property
    def nbytes(self) -> int:
        """A storage's cached copies; its own bytes too where a BF16 layer saved it or nothing cached it."""
        total = 0
        for key, forms in self.forms.items():
            copies = [t for views in forms.values() for form in views.values() for t in form]
            total += sum(t.untyped_storage().nbytes() for t in copies)
            if "bf16" in forms or not copies:
                total += self.plain[key]
        return total


def mark_rules(mods: nn.Module, rules: list[str]) -> list:
    """Module hooks that push each linear layer's rule on `rules` around its forward (module docstring);
    returns the handles."""
    handles = []
    for name, mod in mods.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        leaf = name.rsplit(".", 1)[-1]
        rule = "bf16" if leaf in ("router", "head") else "e5m6" if leaf in ("out", "o") else "fp8"
        handles.append(mod.register_forward_pre_hook(lambda *_, r=rule: rules.append(r)))
        handles.append(mod.register_forward_hook(lambda *_: None if rules.pop() else None))
    return handles


class SwiGLUFromInputs(torch.autograd.Function):
    """down(silu(g) * u) saving g and u (and the weight), not the product: recomputed in backward
    (DeepSeek-AI 2024, sec. 3.3.3, the MoE's SwiGLU)."""

    @staticmethod
    def forward(ctx, g: Tensor, u: Tensor, w: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(g, u, w)
        return F.linear(F.silu(g) * u, w)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        g, u, w = ctx.saved_tensors
        sig = torch.sigmoid(g)
        product = g * sig * u
        dp = grad @ w
        dg = dp * u * sig * (1 + g * (1 - sig))
        return dg, dp * g * sig, grad.reshape(-1, grad.shape[-1]).T @ product.reshape(-1, product.shape[-1])


def _region(recompute: bool, fn: Callable, *args: Tensor):  # type: ignore[no-untyped-def]
    """fn(*args), or a reentrant checkpoint of it that saves only `args` when `recompute`."""
    if not recompute:
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=True, preserve_rng_state=False)


def _down(attn: nn.ModuleDict, x: Tensor, norm: Tensor) -> tuple[Tensor, Tensor]:
    xn = FusedRMSNorm.apply(x, norm)
    return attn["q_down"](xn), attn["kv_down"](xn)


def _up_attention(attn: nn.ModuleDict, ms: ModelShape, b: int, tables: tuple[Tensor, Tensor],
                  q_latent: Tensor, kv_latent: Tensor) -> Tensor:
    m, (cos, sin) = ms.moe.mla, tables
    s = q_latent.shape[0] // b
    q = attn["q_up"](FusedRMSNorm.apply(q_latent, attn["q_norm"].weight))
    q = q.view(b, s, -1, m.qk_nope + m.qk_rope)
    latent, k_rope = kv_latent.split([m.kv_rank, m.qk_rope], dim=-1)
    kv = attn["kv_up"](FusedRMSNorm.apply(latent, attn["kv_norm"].weight))
    kv = kv.view(b, s, -1, m.qk_nope + m.v_dim)
    k_nope, v = kv.split([m.qk_nope, m.v_dim], dim=-1)
    q_nope, q_rope = q.split([m.qk_nope, m.qk_rope], dim=-1)
    q = torch.cat([q_nope, _rope(q_rope, cos, sin)], dim=-1)
    k_rope = _rope(k_rope.view(b, s, 1, m.qk_rope), cos, sin).expand(-1, -1, k_nope.shape[2], -1)
    return MLAFlashAttention.apply(q, torch.cat([k_nope, k_rope], dim=-1), v.contiguous()).flatten(2)


def mla_attention(attn: nn.ModuleDict, norm: Tensor, x: Tensor, b: int, tables: tuple[Tensor, Tensor],
                  ms: ModelShape, savings: Savings) -> Tensor:
    """MLA as `moe_layer.mla_forward` runs it, in two regions recomputed under `savings.recompute`."""
    q_latent, kv_latent = _region(savings.recompute, partial(_down, attn, norm=norm), x)
    out = _region(savings.recompute, partial(_up_attention, attn, ms, b, tables), q_latent, kv_latent)
    return attn["out"](out.reshape(x.shape[0], -1))


def _swiglu_tail(mlp: nn.Module, g: Tensor, u: Tensor, savings: Savings, rules: list[str]) -> Tensor:
    """An MoE SwiGLU after its gate and up projections: under FP8 caching the product and down-projection
    from the two inputs, saved in FP8."""
    if not savings.fp8:
        return mlp.down(F.silu(g) * u)
    rules.append("fp8")
    try:
        return SwiGLUFromInputs.apply(g, u, mlp.down.weight)
    finally:
        rules.pop()


def _moe_in(parts: nn.ModuleDict, h: Tensor) -> tuple[Tensor, ...]:
    xn = FusedRMSNorm.apply(h, parts.norm)
    logits = parts["router"](xn)
    if "shared" not in parts:
        return xn, logits
    return xn, logits, parts["shared"].gate(xn), parts["shared"].up(xn)


def moe_half(parts: nn.ModuleDict, h: Tensor, k: int, group, savings: Savings,  # type: ignore[no-untyped-def]
             rules: list[str]) -> Tensor:
    """`moe_rank.moe_forward` with tp = 1 under `savings`: the norm, router and the shared expert's two
    projections one recomputed region; the experts' and the shared expert's SwiGLU from their inputs."""
    tokens, hidden = h.shape
    ep = torch.distributed.get_world_size(group)
    splits = [tokens * k // ep] * ep
    xn, logits, *shared = _region(savings.recompute, partial(_moe_in, parts), h)
    gates = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1).values
    got = all_to_all(xn.repeat_interleave(k, dim=0), splits, splits, group)
    chunks = got.view(len(parts["experts"]), -1, hidden)
    out = torch.cat([_swiglu_tail(e, e.gate(chunks[i]), e.up(chunks[i]), savings, rules)
                     for i, e in enumerate(parts["experts"])])
    back = all_to_all(out, splits, splits, group)
    y = (back.view(tokens, k, hidden) * gates.to(h.dtype).unsqueeze(-1)).sum(1)
    if shared:
        y = y + _swiglu_tail(parts["shared"], *shared, savings, rules)
    return y


def _ffn_in(mlp: nn.Module, norm: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    xn = FusedRMSNorm.apply(h, norm)
    return mlp.gate(xn), mlp.up(xn)


def dense_ffn(mlp: nn.Module, norm: Tensor, h: Tensor, savings: Savings) -> Tensor:
    """A dense layer's SwiGLU: norm, gate and up one recomputed region; its product cached as the
    down-projection's input (FP8 under FP8 caching: only the linear-input rule, as the estimate)."""
    g, u = _region(savings.recompute, partial(_ffn_in, mlp, norm), h)
    return mlp.down(F.silu(g) * u)


def _head_in(mods: nn.ModuleDict, h: Tensor) -> Tensor:
    return mods["head"](FusedRMSNorm.apply(h, mods["final_norm"].weight))


def head(mods: nn.ModuleDict, h: Tensor, savings: Savings) -> Tensor:
    """The final norm and the output layer (one recomputed region), then the fp32 cross-entropy."""
    logits = _region(savings.recompute, partial(_head_in, mods), h)
    targets = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits.float(), targets)
