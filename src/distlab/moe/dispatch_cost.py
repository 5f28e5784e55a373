"""When hierarchical dispatch pays: bytes across nodes and time, flat all-to-all against two-level.

Notation: N nodes of m ranks (p = Nm), E experts (E/N per node), T tokens per rank of d values of b
bytes, k experts per token, at most M nodes per token (node-limited routing, DeepSeek-AI 2024).

Bytes across nodes, per rank and per direction. The flat all-to-all sends one row per (token, expert);
an expert is on another node with probability (N-1)/N, so kT(N-1)/N rows of db bytes. The hierarchical
dispatch sends one row per (token, node): if a token's experts span J nodes, J rows, of which J(N-1)/N
leave on average (its own node is one of the J with probability J/N). The dispatch row also carries the
k gates (b bytes each) and k expert ids (4 bytes each). For experts chosen uniformly at random,
J is the number of groups hit by a k-subset of E items in N groups of E/N, whose law follows by
inclusion-exclusion:

    P(J = j) = C(N, j) sum_i (-1)^i C(j, i) C((j - i) E/N, k) / C(E, k),

and node-limited routing caps it: J' = min(J, M) (`expected_nodes`). The saving is the ratio E[J']/k.

Time of one dispatch on a cluster of chapter 8 (`distlab.topology.Cluster`: DGX-1, DGX A100,
DGX H100 servers on a fat tree; bandwidths per direction from `distlab.catalog`): B_net, a rank's share
of its server's NICs, and B_nvl, the server's intra-node ring bottleneck (chapter 8's `bottleneck`);
alpha_net and alpha_nvl the hop latencies of the topology. The flat all-to-all drives both kinds of link
at once and waits for the slower:

    T_flat = (p-1) alpha + max(cross_flat / B_net, local_flat / B_nvl)

with local_flat = kT(m-1)/p rows to the other ranks of the node; the hierarchical one runs its two steps
one after the other (DeepSeek-V3 overlaps them in chunks; here they are added, the cautious bound):

    T_hier = (N-1) alpha_net + cross_hier / B_net + (m-1) alpha_nvl + local_hier / B_nvl

with local_hier = kT(m-1)/m, every assignment forwarded once inside its node. Both assume balanced
routing; skew makes the busiest rank the one that counts, in both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from distlab import catalog
from distlab.moe.gating import Routing
from distlab.moe.node_limited import NodeLayout
from distlab.ring_hops import bottleneck
from distlab.topology import Cluster

ID_BYTES = 4  # the expert ids travel as int32


def node_count_law(num_experts: int, nodes: int, k: int) -> list[float]:
    """P(J = j), j = 0..N: the number of nodes hit by k experts drawn uniformly without replacement."""
    if nodes < 1 or num_experts % nodes:
        raise ValueError(f"nodes={nodes} must be a positive divisor of num_experts={num_experts}")
    if not 1 <= k <= num_experts:
        raise ValueError(f"k={k} must be between 1 and num_experts={num_experts}")
    g, total = num_experts // nodes, math.comb(num_experts, k)
    law = [0.0] * (nodes + 1)
    for j in range(1, nodes + 1):
        onto = sum((-1) ** i * math.comb(j, i) * math.comb((j - i) * g, k) for i in range(j + 1))
        law[j] = math.comb(nodes, j) * onto / total
    return law


def expected_nodes(num_experts: int, nodes: int, k: int, max_nodes: int | None = None) -> float:
    """E[min(J, M)]: the nodes one token reaches, uniform routing capped at M (None = no cap)."""
    cap = nodes if max_nodes is None else max_nodes
    return sum(min(j, cap) * pj for j, pj in enumerate(node_count_law(num_experts, nodes, k)))


@dataclass(frozen=True)
class CrossNodeBytes:
    """Bytes one rank sends across nodes in one forward pass (dispatch + combine), flat and hierarchical."""

    flat: float
    hierarchical: float

    @property
    def ratio(self) -> float:
        return self.hierarchical / self.flat if self.flat else 1.0


def expected_cross_node_bytes(layout: NodeLayout, tokens: int, d_model: int, bytes_per_element: int
                              ) -> CrossNodeBytes:
    """The model of the module docstring, for uniform routing, per rank and forward pass."""
    n, k, b = layout.nodes, layout.k, bytes_per_element
    leave = (n - 1) / n
    row = d_model * b
    flat = 2 * k * tokens * leave * row
    pairs = tokens * expected_nodes(layout.num_experts, n, k, layout.max_nodes) * leave
    return CrossNodeBytes(flat, pairs * (2 * row + k * (b + ID_BYTES)))


def routed_cross_node_rows(routing: Routing, layout: NodeLayout, rank: int) -> tuple[int, int]:
    """(flat, hierarchical) rows that the dispatch of `rank` sends across nodes, for this routing."""
    node = rank // layout.ranks_per_node
    nodes = layout.node_of(routing.expert_index)
    flat = int(((nodes != node) & routing.kept).sum())
    hit = torch.zeros(nodes.shape[0], layout.nodes, dtype=torch.bool)
    hit.scatter_(1, nodes.cpu(), routing.kept.cpu())
    hit[:, node] = False
    return flat, int(hit.sum())


@dataclass(frozen=True)
class DispatchTime:
    """Predicted seconds of one dispatch all-to-all, flat and hierarchical, and the figures used."""

    flat: float
    hierarchical: float
    net_GBps: float
    nvl_GBps: float

    @property
    def speedup(self) -> float:
        """T_flat / T_hier: above 1, hierarchical dispatch pays."""
        return self.flat / self.hierarchical


def _links(server: str, nodes: int) -> tuple[float, float, float, float]:
    """(B_net, alpha_net, B_nvl, alpha_nvl) of one rank on `nodes` servers, from chapter 8's topology."""
    cluster = Cluster(server, max(nodes, 2))
    spec, topo = catalog.lookup("server", server), cluster.topology
    net_share = spec.nics * spec.nic_GBps_per_direction / spec.gpus
    path = topo.path(cluster.gpu(0, 0), cluster.gpu(1, 0))
    links = [topo.link(path[i], path[i + 1]) for i in range(len(path) - 1)]
    net = min(min(link.GBps for link in links), net_share)
    intra = bottleneck(topo, [cluster.gpu(0, j) for j in cluster.intra_order])
    return net, sum(link.latency for link in links), intra.GBps, intra.latency


def dispatch_time(server: str, nodes: int, num_experts: int, k: int, tokens: int, d_model: int,
                  bytes_per_element: int = 2, max_nodes: int | None = None) -> DispatchTime:
    """The two formulas of the module docstring on `nodes` servers of kind `server` (one rank per GPU)."""
    m = catalog.lookup("server", server).gpus
    layout = NodeLayout(num_experts, nodes * m, m, k, max_nodes)
    net, a_net, nvl, a_nvl = _links(server, nodes)
    row, p, n = d_model * bytes_per_element, nodes * m, nodes
    cross_flat = k * tokens * (n - 1) / n * row
    local_flat = k * tokens * (m - 1) / p * row
    flat = (p - 1) * (a_net if n > 1 else a_nvl) + max(cross_flat / (net * 1e9), local_flat / (nvl * 1e9))
    reach = expected_nodes(num_experts, n, k, layout.max_nodes)
    cross_hier = tokens * reach * (n - 1) / n * (row + k * (bytes_per_element + ID_BYTES))
    local_hier = k * tokens * (m - 1) / m * row
    hier = (n - 1) * a_net + cross_hier / (net * 1e9) + (m - 1) * a_nvl + local_hier / (nvl * 1e9)
    return DispatchTime(flat, hier, net, nvl)
