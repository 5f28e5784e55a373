"""Parity of hierarchical dispatch with the flat all-to-all and the single-process layer, and its bytes.

`hierarchical_parity(cases, group=None)` runs on every rank of `group`, several cases in one launch. For
each case every rank builds the same `NodeLimitedMoE` from the seed, runs it on the whole batch, takes
its share twice (`HierarchicalMoE.from_reference` with dispatch="hierarchical" and "flat"), runs both on
its own tokens inside a `distlab.comm_log`, and compares, in float64 (tolerance 1e-10, as chapter 6's
`parity.py`: the three add the same terms in different orders):

- outputs, gradients of the input tokens, of the router (summed over ranks: it is replicated) and of
  this rank's experts, of each dispatch with the reference, and of the two dispatches with each other;
- the bytes across nodes: what the log recorded under "inter" (every byte of that step leaves the node)
  against `DispatchStats`, and the rows the rank's own routing predicts (`routed_cross_node_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from distlab.comm_log import comm_log
from distlab.mesh import group_rank, group_size
from distlab.moe.dispatch_cost import routed_cross_node_rows
from distlab.moe.hierarchical import DispatchStats, HierarchicalMoE
from distlab.moe.node_limited import NodeLayout, NodeLimitedMoE, nodes_reached
from distlab.parity import ParityReport, compare


@dataclass
class HierCase:
    """Tokens per rank (`sizes[r]`), experts, k, ranks per simulated node, M (None: no limit)."""

    sizes: list[int]
    num_experts: int
    k: int
    ranks_per_node: int
    max_nodes: int | None = None
    d_model: int = 8
    d_hidden: int = 16
    seed: int = 0
    collapsed: bool = False  # every token prefers expert 0: other ranks' experts get nothing

    def label(self) -> str:
        return (f"tokens per rank {self.sizes}, E={self.num_experts}, k={self.k}, "
                f"{len(self.sizes) // self.ranks_per_node} nodes x {self.ranks_per_node}, M={self.max_nodes}")


@dataclass
class HierResult:
    """One rank, one case: the parity reports, the two dispatches' stats and their logged bytes."""

    case: HierCase
    reports: dict[str, ParityReport]
    stats: dict[str, DispatchStats]
    logged_inter: float  # forward bytes the log recorded under "inter" (hierarchical)
    logged_flat: float  # forward bytes the log recorded under "flat" (all leave the rank)
    predicted_rows: tuple[int, int]  # routed_cross_node_rows: (flat, hierarchical) dispatch rows
    max_nodes_reached: int

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.reports.values())


def _grad(prm: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient; zeros when it took no part (an expert no token chose, in the reference)."""
    return torch.zeros_like(prm) if prm.grad is None else prm.grad


def _grads(layer, x: torch.Tensor, group) -> dict[str, torch.Tensor]:
    router = layer.router.w_g.weight.grad.clone()
    if group_size(group) > 1:
        dist.all_reduce(router, group=group)
    out = {"input grad": x.grad, "router grad": router}
    for j, expert in enumerate(layer.experts):
        for name, prm in expert.named_parameters():
            out[f"expert {layer.first_expert + j} {name}"] = _grad(prm)
    return out


def _reference_grads(ref: NodeLimitedMoE, x: torch.Tensor, first: int, count: int, a: int, b: int) -> dict:
    out = {"input grad": x.grad[a:b], "router grad": ref.router.w_g.weight.grad}
    for e in range(first, first + count):
        for name, prm in ref.experts[e].named_parameters():
            out[f"expert {e} {name}"] = _grad(prm)
    return out


def parity_one(case: HierCase, group: dist.ProcessGroup | None = None) -> HierResult:
    """Run one case on this rank (every rank of `group` calls it with the same case)."""
    r, p = group_rank(group), group_size(group)
    if len(case.sizes) != p:
        raise ValueError(f"sizes={case.sizes} must give one token count per rank ({p} ranks)")
    layout = NodeLayout(case.num_experts, p, case.ranks_per_node, case.k, case.max_nodes)
    torch.manual_seed(case.seed)
    ref = NodeLimitedMoE(case.d_model, case.d_hidden, layout).double()
    g = torch.Generator().manual_seed(case.seed + 1)
    x = torch.randn(sum(case.sizes), case.d_model, generator=g, dtype=torch.float64)
    w = torch.randn(sum(case.sizes), case.d_model, generator=g, dtype=torch.float64)
    if case.collapsed:
        with torch.no_grad():
            ref.router.w_g.weight.zero_()
            ref.router.w_g.weight[0, 0] = 10.0
        x[:, 0] = 1.0
    x_ref = x.clone().requires_grad_()
    y_ref, routing_ref = ref(x_ref)
    ((y_ref * w).sum()).backward()
    a, b = sum(case.sizes[:r]), sum(case.sizes[:r + 1])

    outs, stats, grads, logs, routing = {}, {}, {}, {}, None
    for mode in ("hierarchical", "flat"):
        layer = HierarchicalMoE.from_reference(ref, mode, group)
        x_mine = x[a:b].clone().requires_grad_()
        with comm_log() as log:
            out = layer(x_mine)
            (out.y * w[a:b]).sum().backward()
        outs[mode], stats[mode], routing = out.y.detach(), out.stats, out.routing
        grads[mode] = _grads(layer, x_mine, group)
        logs[mode] = log
    el = layout.experts_per_rank
    want = {"output": y_ref[a:b].detach(), "gradients": _reference_grads(ref, x_ref, r * el, el, a, b)}
    reports = {mode: compare({"output": outs[mode], "gradients": grads[mode]}, want, dtype=torch.float64,
                             label=f"{mode}, {case.label()}", against="one process")
               for mode in outs}
    reports["hierarchical vs flat"] = compare(
        {"output": outs["hierarchical"], "gradients": grads["hierarchical"]},
        {"output": outs["flat"], "gradients": grads["flat"]},
        dtype=torch.float64, label=case.label(), against="the flat all-to-all")

    def forward_bytes(log, label: str) -> float:
        return sum(rec.sent_bytes for rec in log.select(op="all_to_all", where=label, phase="forward"))

    reached = int(nodes_reached(routing, layout).max()) if routing.expert_index.numel() else 0
    return HierResult(case, reports, stats, forward_bytes(logs["hierarchical"], "inter"),
                      forward_bytes(logs["flat"], "flat"), routed_cross_node_rows(routing, layout, r),
                      reached)


def hierarchical_parity(cases: list[HierCase], group: dist.ProcessGroup | None = None) -> list[HierResult]:
    """Run every case on this rank of `group`, in order (one launch for all of them)."""
    return [parity_one(c, group) for c in cases]
