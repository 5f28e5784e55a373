"""The course GPT with its attention core replaced by ring attention: every rank holds L/p tokens.

Only attention mixes positions, so context parallelism changes nothing else in the model: the
embeddings, LayerNorms, MLPs and the output layer work on the rank's own tokens, with the position
embedding looked up at the tokens' *global* positions (`layouts.positions`). The weights are replicated
on every rank of the cp group, so each rank's weight gradient is the part from its own tokens and an
all-reduce (sum) over the group gives the whole gradient, as data parallelism does over the batch
(Dubey et al. 2024, sec. 3.3.2 treats cp this way, with the gradients reduced over cp and dp together).
"""

from __future__ import annotations

import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distlab.context_parallel.layouts import IGNORE_INDEX, positions, shard
from distlab.context_parallel.ring import RingStats, ring_attention
from distlab.mesh import group_rank, group_size
from distlab.models import GPT, CausalSelfAttention


class RingSelfAttention(nn.Module):
    """`distlab.models.CausalSelfAttention` on this rank's tokens, its core computed by ring attention
    (Liu et al. 2023). Shares `c_attn` and `c_proj` with the module it wraps, so the weights are one."""

    def __init__(self, attn: CausalSelfAttention, group: dist.ProcessGroup | None = None,
                 layout: str = "zigzag", stats: RingStats | None = None) -> None:
        super().__init__()
        if attn.dropout:
            raise ValueError(f"dropout={attn.dropout} in attention is not supported by ring attention "
                             "here (each rank would need the same mask as the dense model); use dropout=0.0")
        self.attn, self.group, self.layout, self.stats = attn, group, layout, stats

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, S_local, C), this rank's tokens in its layout order."""
        B, S, C = x.shape
        a = self.attn.n_head
        q, k, v = (t.view(B, S, a, C // a).transpose(1, 2) for t in self.attn.c_attn(x).split(C, dim=2))
        y = ring_attention(q, k, v, group=self.group, layout=self.layout, stats=self.stats)
        return self.attn.resid_dropout(self.attn.c_proj(y.transpose(1, 2).contiguous().view(B, S, C)))


def cp_gpt_loss(model: GPT, idx: Tensor, targets: Tensor, group: dist.ProcessGroup | None = None,
                layout: str = "zigzag", ignore_index: int = IGNORE_INDEX) -> Tensor:
    """This rank's share of the mean cross-entropy of `model` on the full batch (idx, targets: (B, L),
    the same on every rank): the sum over its tokens divided by the number of targets in the whole
    batch that are not `ignore_index`, so the shares add up to `F.cross_entropy(logits, targets,
    ignore_index=ignore_index)` of the dense model, padding and masked targets included (NaN, as there,
    when every target is ignored). Every rank holds all the targets, so it counts them without
    communication; dividing by B L instead would count the ignored ones and shrink the loss."""
    p, r = group_size(group), group_rank(group, "context-parallel group")
    L = idx.shape[1]
    if targets.shape != idx.shape:
        raise ValueError(f"targets has shape {tuple(targets.shape)} but idx has {tuple(idx.shape)}; pass "
                         "one target per input token (padded with ignore_index where there is none)")
    idx_local, targets_local = shard(idx, r, p, layout, dim=1), shard(targets, r, p, layout, dim=1)
    x = model.drop(model.wte(idx_local) + model.wpe(positions(r, p, L, layout).to(idx.device)))
    for block in model.h:
        x = x + RingSelfAttention(block.attn, group, layout)(block.ln_1(x))
        x = x + block.mlp(block.ln_2(x))
    logits = model.lm_head(model.ln_f(x))
    counted = (targets != ignore_index).sum()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets_local.reshape(-1),
                           ignore_index=ignore_index, reduction="sum") / counted


def all_reduce_grads(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Sum every parameter's gradient over the cp group: each rank had only its tokens' part."""
    if group_size(group) == 1:
        return
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, group=group)
