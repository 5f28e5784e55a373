"""Node-limited routing: each token's experts live on at most M nodes (DeepSeek-AI 2024, sec. 2.1.2).

Under expert parallelism over p ranks in N nodes of m ranks each (consecutive ranks of the group form a
node, as in chapter 1's two-level all-reduce), expert e lives on rank e // (E/p) and so on node
e // (E/N). A token whose k experts are spread over many nodes crosses the slow network once per node.
DeepSeek-V3 bounds that number: for each token it scores every node by the sum of the highest k/M
affinities among the node's experts, keeps the M best nodes, and picks its k experts among the experts of
those nodes only (with k = 8 and M = 4 in DeepSeek-V3). The gates are the chosen experts' probabilities,
as in ordinary top-k. With M = N nothing is excluded and the routing is plain top-k.

`NodeLayout` names the layout and validates it (a ValueError that says what to change); `node_mask` is the
(T, E) choice of allowed experts, and `node_limited_gating` the dropless routing restricted to it
(`dropless.dropless_gating`), which the hierarchical dispatch (`hierarchical.py`) and the single-process
reference both call, so they route identically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from distlab.moe.dropless import dropless_gating
from distlab.moe.gating import Router, Routing, check_moe_config, check_tokens
from distlab.moe.layer import ExpertFFN, combine


@dataclass(frozen=True)
class NodeLayout:
    """E experts over p ranks, the ranks cut into nodes of `ranks_per_node` consecutive ranks, and the most
    nodes a token may reach, `max_nodes` (M; None = every node, no limit)."""

    num_experts: int
    world_size: int
    ranks_per_node: int
    k: int
    max_nodes: int | None = None

    def __post_init__(self) -> None:
        check_moe_config(self.num_experts, self.k, 1.0, self.world_size)
        m, p = self.ranks_per_node, self.world_size
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"ranks_per_node={m!r} must be a positive integer (ranks that share a node), "
                             "e.g. ranks_per_node=2")
        if p % m:
            ok = [d for d in range(1, p + 1) if p % d == 0]
            raise ValueError(f"ranks_per_node={m} does not divide world_size={p}: every simulated node must "
                             f"hold the same number of ranks; choose ranks_per_node in {ok}")
        if self.max_nodes is not None:
            self._check_max_nodes()

    def _check_max_nodes(self) -> None:
        """M must be a positive integer, at most N, and its nodes must hold at least k experts."""
        big_m, p, m = self.max_nodes, self.world_size, self.ranks_per_node
        if isinstance(big_m, bool) or not isinstance(big_m, int) or big_m < 1:
            raise ValueError(f"max_nodes={big_m!r} must be a positive integer (M, nodes a token may "
                             "reach) or None for no limit")
        if big_m > self.nodes:
            raise ValueError(f"max_nodes={big_m} is larger than the {self.nodes} nodes there are "
                             f"(world_size={p} / ranks_per_node={m}); choose max_nodes <= {self.nodes}")
        if self.k > big_m * self.experts_per_node:
            raise ValueError(f"k={self.k} experts cannot fit on max_nodes={big_m} nodes of "
                             f"{self.experts_per_node} experts each; choose k <= "
                             f"{big_m * self.experts_per_node} or a larger max_nodes")

    @property
    def nodes(self) -> int:
        """N, the number of nodes."""
        return self.world_size // self.ranks_per_node

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.world_size

    @property
    def experts_per_node(self) -> int:
        return self.num_experts // self.nodes

    @property
    def limit(self) -> int:
        """M, with None read as N."""
        return self.nodes if self.max_nodes is None else self.max_nodes

    def rank_of(self, expert: Tensor) -> Tensor:
        """The group rank that holds each expert."""
        return expert // self.experts_per_rank

    def node_of(self, expert: Tensor) -> Tensor:
        """The node that holds each expert."""
        return expert // self.experts_per_node


def node_mask(probs: Tensor, layout: NodeLayout) -> Tensor:
    """(T, E) bool: the experts on each token's M best nodes, a node scored by the sum of its top
    ceil(k/M) probabilities (DeepSeek-AI 2024, sec. 2.1.2, with k/M rounded up when M does not divide k)."""
    t = probs.shape[0]
    n, per_node, big_m = layout.nodes, layout.experts_per_node, layout.limit
    if big_m >= n:
        return torch.ones_like(probs, dtype=torch.bool)
    top = min(per_node, math.ceil(layout.k / big_m))
    node_score = probs.detach().reshape(t, n, per_node).topk(top, dim=-1).values.sum(-1)  # (T, N)
    best = node_score.topk(big_m, dim=-1).indices
    allowed_nodes = torch.zeros(t, n, dtype=torch.bool, device=probs.device).scatter(1, best, True)
    return allowed_nodes.repeat_interleave(per_node, dim=1)


def node_limited_gating(logits: Tensor, layout: NodeLayout, normalize: bool = True) -> Routing:
    """Dropless top-k routing restricted to each token's M best nodes (module docstring)."""
    if logits.dim() != 2 or logits.shape[1] != layout.num_experts:
        raise ValueError(f"logits must have shape (tokens, {layout.num_experts}), got {tuple(logits.shape)}")
    probs = torch.softmax(logits, dim=-1)
    return dropless_gating(logits, layout.k, normalize, allowed=node_mask(probs, layout))


def nodes_reached(routing: Routing, layout: NodeLayout) -> Tensor:
    """(T,) the number of distinct nodes each token's kept experts live on."""
    hit = torch.zeros(routing.expert_index.shape[0], layout.nodes, dtype=torch.bool)
    nodes = layout.node_of(routing.expert_index).cpu()
    hit.scatter_(1, nodes, routing.kept.cpu())
    return hit.sum(1)


class NodeLimitedMoE(nn.Module):
    """The single-process reference: a router and all E experts, node-limited dropless routing, and
    `layer.combine`. The ranks' `HierarchicalMoE.from_reference` copies its router and their experts."""

    def __init__(self, d_model: int, d_hidden: int, layout: NodeLayout, normalize: bool = True) -> None:
        super().__init__()
        check_moe_config(layout.num_experts, layout.k, 1.0, d_model=d_model, d_hidden=d_hidden)
        self.layout, self.normalize = layout, normalize
        self.router = Router(d_model, layout.num_experts)
        self.experts = nn.ModuleList(ExpertFFN(d_model, d_hidden) for _ in range(layout.num_experts))

    def forward(self, x: Tensor) -> tuple[Tensor, Routing]:
        """x: (..., d_model) -> (y of the same shape, the routing of the flattened tokens)."""
        check_tokens(x, self.router.w_g.weight)
        tokens = x.reshape(-1, x.shape[-1])
        routing = node_limited_gating(self.router(tokens), self.layout, self.normalize)
        return combine(tokens, routing, self.experts).reshape(x.shape), routing
