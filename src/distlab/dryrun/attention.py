"""Attention on the meta device as the real run computes it: the fused kernel, not the math path.

`F.scaled_dot_product_attention` picks its kernel by device. On a GPU it runs FlashAttention (16-bit) or
the memory-efficient kernel (float32), on a CPU with real tensors PyTorch's own flash kernel; each saves,
for the backward, only q, k, v, its output and the log-sum-exp of every row of scores, a b x a x s tensor
in float32 (Dao et al. 2022, sec. 3.1: the backward recomputes the probabilities from it). On the meta
device there is no fused kernel: PyTorch takes the math path (`_fused_sdp_choice` answers "math" for a
meta tensor), whose softmax saves the b x a x s x s probabilities, 4.3 GB per block and micro-batch of
Llama 3 405B's shape on one tp rank in float32. A dry run that measures that path measures a memory
no real run has.

`FusedAttentionOnMeta()` is a `TorchFunctionMode` that, while open, sends every
`scaled_dot_product_attention` whose query is a meta tensor to the CPU flash kernel's op,
`aten._scaled_dot_product_flash_attention_for_cpu`, which has a meta implementation and an autograd
formula: the graph then saves exactly what the fused kernel saves. Dropout and explicit masks are refused
(the course's trainer uses neither; the kernel's random state would be saved too). The math path stays
available: a dry run with `attention="math"` does not open this mode.

ATTENTIONS names the two, as chapter 7's estimator does ("flash" and "math").
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["ATTENTIONS", "check_attention", "FusedAttentionOnMeta"]

ATTENTIONS = {
    "flash": "the fused kernel a real run uses: saves q, k, v, its output and a b x a x s fp32 log-sum-exp",
    "math": "PyTorch's math path, the meta device's own: saves the b x a x s x s probabilities",
}


def check_attention(attention: str) -> str:
    """`attention` if it is one of ATTENTIONS, else a ValueError naming the choices."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention={attention!r} is unknown; choose 'flash' (the fused kernel a real run "
                         f"uses) or 'math' (the path the meta device takes by itself, s x s probabilities)")
    return attention


def _flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
           dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
           enable_gqa: bool = False) -> torch.Tensor:
    if attn_mask is not None or dropout_p != 0.0:
        raise ValueError(f"a dry run's fused attention takes no attn_mask and dropout_p=0 (got attn_mask="
                         f"{'a tensor' if attn_mask is not None else None}, dropout_p={dropout_p}); run it "
                         "with attention='math' or a model without attention dropout")
    if enable_gqa and key.shape[-3] != query.shape[-3]:  # repeat the kv heads, as the math path does
        rep = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(rep, dim=-3), value.repeat_interleave(rep, dim=-3)
    out, _lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=None, scale=scale)
    return out


class FusedAttentionOnMeta(TorchFunctionMode):
    """While open, `scaled_dot_product_attention` on meta tensors runs the fused (flash) kernel's op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        query = args[0] if args else kwargs.get("query")
        if getattr(func, "__name__", "") == "scaled_dot_product_attention" and \
                isinstance(query, torch.Tensor) and query.is_meta:
            return _flash(*args, **kwargs)
        return func(*args, **kwargs)
