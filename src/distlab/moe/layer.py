"""The single-process mixture-of-experts layer: the reference every parallel version is checked against.

y_t = sum over the k chosen experts e of g_{t,e} * FFN_e(x_t)   (Shazeer et al. 2017, eq. 1)

A token whose every choice was dropped for lack of capacity gets y_t = 0 here; the block around the
layer, x + MoE(x), carries it on unchanged through the residual path (Fedus et al. 2022, sec. 2.2).

Capacity is counted per *group* of tokens, as in GShard (Lepikhin et al. 2021, sec. 2.2, "local group
dispatching"): the T tokens are cut into consecutive groups, each routed on its own with capacity
C = ceil(k * T_group / E * capacity_factor). Under expert parallelism a group is one rank's tokens, so
`forward(x, group_sizes=[tokens of rank 0, tokens of rank 1, ...])` routes exactly as the ranks do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from distlab.moe.gating import (
    Router,
    Routing,
    check_moe_config,
    check_tokens,
    load_balancing_loss,
    router_z_loss,
    top_k_gating,
)


class ExpertFFN(nn.Module):
    """One expert: the Transformer's feed-forward block, d_model -> d_hidden -> d_model with a GELU."""

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.w_in = nn.Linear(d_model, d_hidden)
        self.act = nn.GELU()
        self.w_out = nn.Linear(d_hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_out(self.act(self.w_in(x)))


@dataclass
class MoEOutput:
    """What a MoE layer returns: the output (same shape as x), the auxiliary losses averaged over the
    groups, and the routing of each group (for histograms and drop rates)."""

    y: Tensor
    aux_loss: Tensor
    z_loss: Tensor
    routings: list[Routing]

    def tokens_per_expert(self, kept_only: bool = True) -> Tensor:
        return sum(r.tokens_per_expert(kept_only) for r in self.routings)

    def dropped_fraction(self) -> float:
        kept = torch.cat([r.kept.reshape(-1) for r in self.routings])
        return 1.0 - float(kept.float().mean()) if kept.numel() else 0.0


def combine(x: Tensor, routing: Routing, experts: Sequence[nn.Module], first_expert: int = 0) -> Tensor:
    """Dispatch each kept (token, choice) to its expert, run each expert once on its tokens, and add the
    gate-weighted results back per token. `experts[i]` is global expert first_expert + i."""
    y = torch.zeros_like(x)
    for i, expert in enumerate(experts):
        mine = (routing.expert_index == first_expert + i) & routing.kept
        token, choice = torch.nonzero(mine, as_tuple=True)
        if token.numel():
            gate = routing.gates[token, choice].unsqueeze(-1).to(x.dtype)
            y = y.index_add(0, token, gate * expert(x[token]))
    return y


class MoELayer(nn.Module):
    """A sparsely gated mixture-of-experts feed-forward layer on one process (the reference).

    d_model, d_hidden: the experts' widths. num_experts: E. k: experts per token (1 = Switch, 2 = GShard).
    capacity_factor: slack over the even share (module docstring of `gating`). normalize: renormalise
    the k gates to sum to 1 when k > 1. noisy: noisy top-k gating in training mode (Shazeer et al. 2017).
    """

    def __init__(self, d_model: int, d_hidden: int, num_experts: int, k: int = 1,
                 capacity_factor: float = 1.25, normalize: bool = True, noisy: bool = False) -> None:
        super().__init__()
        check_moe_config(num_experts, k, capacity_factor, d_model=d_model, d_hidden=d_hidden)
        self.num_experts, self.k = num_experts, k
        self.capacity_factor, self.normalize = capacity_factor, normalize
        self.router = Router(d_model, num_experts, noisy)
        self.experts = nn.ModuleList(ExpertFFN(d_model, d_hidden) for _ in range(num_experts))

    def route(self, x: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Routing]:
        """Router logits and routing of one group of tokens x (T, d_model)."""
        logits = self.router(x, generator)
        return logits, top_k_gating(logits, self.k, self.capacity_factor, self.normalize)

    def forward(self, x: Tensor, group_sizes: Sequence[int] | None = None,
                generator: torch.Generator | None = None) -> MoEOutput:
        """x: (..., d_model). Tokens are flattened in order; group_sizes splits them into GShard groups
        (default: one group). The losses are the mean over groups of each group's loss."""
        check_tokens(x, self.router.w_g.weight)
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        sizes = [tokens.shape[0]] if group_sizes is None else list(group_sizes)
        if sum(sizes) != tokens.shape[0] or any(s < 0 for s in sizes):
            raise ValueError(f"group_sizes={sizes} must be non-negative and add up to the {tokens.shape[0]} "
                             "tokens in x")
        outs, routings, aux, z = [], [], [], []
        for group in torch.split(tokens, sizes):
            logits, routing = self.route(group, generator)
            outs.append(combine(group, routing, self.experts))
            routings.append(routing)
            aux.append(load_balancing_loss(routing))
            z.append(router_z_loss(logits))
        return MoEOutput(torch.cat(outs).reshape(shape), torch.stack(aux).mean(), torch.stack(z).mean(),
                         routings)

