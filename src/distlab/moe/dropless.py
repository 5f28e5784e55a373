"""Dropless routing: no capacity, so no token is dropped, and each expert takes a batch of its own size.

A capacity factor forces a choice between dropping tokens (rho small) and computing padding (rho large).
MegaBlocks (Gale, Narayanan, Young & Zaharia 2023, sec. 3-5) removes the choice: it sorts the (token,
choice) assignments by expert, so that each expert's tokens are one contiguous block of a concatenated
buffer, and runs the experts as one *grouped* (block-diagonal) matrix product over blocks of whatever size
routing gave them. Nothing is dropped and nothing is padded; what remains is the imbalance itself, which
now shows up as one expert doing more work than another instead of as dropped tokens.

This file holds:
- `dropless_gating(logits, k)`: top-k routing with every assignment kept (`Routing.capacity` is T, the
  most one expert can receive), optionally restricted to `allowed` experts per token (node-limited
  routing, `node_limited.py`, builds on it) and with a selection `bias` (`aux_free.py`).
- `grouped_mm(x, weight, group_sizes)`: the grouped matrix product over consecutive row blocks, written
  as one matmul per block (what a grouped GEMM kernel does in one launch).
- `GroupedExperts`: E feed-forward experts with their weights stacked, (E, d, h) and (E, h, d), run on the
  concatenated, expert-sorted rows with two grouped products.
- `DroplessMoE`: router + `GroupedExperts`, the single-process dropless layer; `dense_reference` runs
  every expert on every token and weights the outputs by the dense combine weights (the definition of
  the layer, Shazeer et al. 2017, eq. 1, without any dispatch); `load_imbalance` measures what dropless
  routing exposes: the busiest expert's rows over the mean (the capacity factor a capacity-based layer
  would have needed to drop nothing), and what such a layer would drop or pad instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distlab.moe.gating import (
    Router,
    Routing,
    check_moe_config,
    check_tokens,
    load_balancing_loss,
    priority_positions,
)
from distlab.moe.layer import ExpertFFN


def dropless_gating(logits: Tensor, k: int, normalize: bool = True, allowed: Tensor | None = None,
                    bias: Tensor | None = None) -> Routing:
    """Top-k routing of T tokens from their (T, E) logits with nothing dropped (module docstring).

    allowed: optional (T, E) bool, the experts each token may pick (others are never chosen).
    bias: optional (E,) added to the probabilities for the *choice* only; the gates stay the chosen
    probabilities (Wang et al. 2024, eq. 3: the bias steers selection, not the weights).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (tokens, experts), got {tuple(logits.shape)}")
    t, e = logits.shape
    check_moe_config(e, k, 1.0)
    probs = torch.softmax(logits, dim=-1)
    score = probs.detach() if bias is None else probs.detach() + bias.to(probs.dtype)
    if allowed is not None:
        score = score.masked_fill(~allowed, -math.inf)
    expert_index = score.topk(k, dim=-1).indices
    chosen = probs.gather(1, expert_index)
    gates = chosen / chosen.sum(-1, keepdim=True) if (normalize and k > 1) else chosen
    kept = torch.ones_like(expert_index, dtype=torch.bool)
    return Routing(probs, expert_index, gates, priority_positions(expert_index, e), kept, t)


def grouped_mm(x: Tensor, weight: Tensor, group_sizes: list[int]) -> Tensor:
    """Rows x[offset_g : offset_g + group_sizes[g]] times weight[g], for each group g, concatenated.

    x: (sum(group_sizes), a), weight: (G, a, b) -> (sum(group_sizes), b). A grouped GEMM (MegaBlocks'
    block-diagonal product; torch's `_grouped_mm` on recent GPUs) does this in one kernel; here it is one
    matmul per group, which gives the same result.
    """
    if len(group_sizes) != weight.shape[0] or sum(group_sizes) != x.shape[0]:
        raise ValueError(f"group_sizes={group_sizes} must have one entry per weight ({weight.shape[0]}) and "
                         f"add up to the {x.shape[0]} rows of x")
    return torch.cat([rows @ w for rows, w in zip(torch.split(x, group_sizes), weight, strict=True)]) \
        if x.shape[0] else x.new_zeros((0, weight.shape[-1]))


class GroupedExperts(nn.Module):
    """E experts d -> h -> d (GELU) with stacked weights, run as two grouped products on sorted rows."""

    def __init__(self, num_experts: int, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.w_in = nn.Parameter(torch.empty(num_experts, d_model, d_hidden))
        self.b_in = nn.Parameter(torch.empty(num_experts, d_hidden))
        self.w_out = nn.Parameter(torch.empty(num_experts, d_hidden, d_model))
        self.b_out = nn.Parameter(torch.empty(num_experts, d_model))
        for e in range(num_experts):  # initialised as nn.Linear would be, expert by expert
            self.load_expert(e, ExpertFFN(d_model, d_hidden))

    @torch.no_grad()
    def load_expert(self, e: int, ffn: ExpertFFN) -> None:
        """Copy one `ExpertFFN`'s weights into slot e (nn.Linear stores W transposed: y = x W^T + b)."""
        self.w_in[e].copy_(ffn.w_in.weight.t())
        self.b_in[e].copy_(ffn.w_in.bias)
        self.w_out[e].copy_(ffn.w_out.weight.t())
        self.b_out[e].copy_(ffn.w_out.bias)

    def forward(self, rows: Tensor, group_sizes: list[int]) -> Tensor:
        """rows sorted by expert, group_sizes[e] of them for expert e."""
        index = torch.repeat_interleave(torch.arange(len(group_sizes), device=rows.device),
                                        torch.tensor(group_sizes, device=rows.device))
        hidden = F.gelu(grouped_mm(rows, self.w_in, group_sizes) + self.b_in[index])
        return grouped_mm(hidden, self.w_out, group_sizes) + self.b_out[index]


@dataclass
class DroplessOutput:
    """The layer's output, Switch's auxiliary loss of the routing, the routing, and the rows per expert."""

    y: Tensor
    aux_loss: Tensor
    routing: Routing
    group_sizes: list[int]


class DroplessMoE(nn.Module):
    """A dropless MoE layer on one process: route, sort by expert, two grouped products, combine."""

    def __init__(self, d_model: int, d_hidden: int, num_experts: int, k: int = 1,
                 normalize: bool = True) -> None:
        super().__init__()
        check_moe_config(num_experts, k, 1.0, d_model=d_model, d_hidden=d_hidden)
        self.num_experts, self.k, self.normalize = num_experts, k, normalize
        self.router = Router(d_model, num_experts)
        self.experts = GroupedExperts(num_experts, d_model, d_hidden)

    def forward(self, x: Tensor, bias: Tensor | None = None) -> DroplessOutput:
        check_tokens(x, self.router.w_g.weight)
        tokens = x.reshape(-1, x.shape[-1])
        routing = dropless_gating(self.router(tokens), self.k, self.normalize, bias=bias)
        token, choice = torch.nonzero(routing.kept, as_tuple=True)
        expert = routing.expert_index[token, choice]
        order = torch.argsort(expert, stable=True)
        token, choice, expert = token[order], choice[order], expert[order]
        sizes = torch.bincount(expert, minlength=self.num_experts).tolist()
        out = self.experts(tokens[token], sizes)
        gate = routing.gates[token, choice].unsqueeze(-1)
        y = torch.zeros_like(tokens).index_add(0, token, gate * out)
        return DroplessOutput(y.reshape(x.shape), load_balancing_loss(routing), routing, sizes)


def dense_reference(layer: DroplessMoE, x: Tensor) -> Tensor:
    """Every expert on every token, weighted by the dense (T, E) combine weights: no dispatch at all."""
    tokens = x.reshape(-1, x.shape[-1])
    weights = dropless_gating(layer.router(tokens), layer.k, layer.normalize).combine_weights()
    ex = layer.experts
    hidden = F.gelu(torch.einsum("td,edh->teh", tokens, ex.w_in) + ex.b_in)
    outs = torch.einsum("teh,ehd->ted", hidden, ex.w_out) + ex.b_out  # (T, E, d)
    return (weights.unsqueeze(-1) * outs).sum(1).reshape(x.shape)


@dataclass(frozen=True)
class Imbalance:
    """What dropless routing exposes in one batch: rows per expert; the busiest expert's rows over the
    mean, which is also the capacity factor a capacity-based layer needs to drop nothing (Fedus et al.
    2022, sec. 2.2: C = rho kT/E); the share of assignments such a layer drops at rho = 1; and the share
    of its computed rows that would be padding if it ran every expert at the busiest one's size."""

    rows: list[int]
    max_over_mean: float
    dropped_at_rho_1: float
    padding_without_drops: float


def load_imbalance(group_sizes: list[int]) -> Imbalance:
    """`Imbalance` of one dropless batch; group_sizes[e] is the rows expert e received."""
    total, e = sum(group_sizes), len(group_sizes)
    if total == 0:
        return Imbalance(list(group_sizes), 1.0, 0.0, 0.0)
    capacity = math.ceil(round(total / e, 9))
    dropped = sum(max(0, n - capacity) for n in group_sizes) / total
    busiest = max(group_sizes)
    return Imbalance(list(group_sizes), busiest * e / total, dropped, 1 - total / (e * busiest))
