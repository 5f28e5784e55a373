"""Hierarchical dispatch: the all-to-all split into a step across nodes and a step inside each node.

DeepSeek-V3 (DeepSeek-AI 2024, sec. 3.2.2) sends each token across the network (InfiniBand) at most once
per destination node, to the GPU with the same in-node index there, which forwards it over NVLink to the
GPUs that hold its experts. With node-limited routing (`node_limited.py`) a token reaches at most M
nodes, so it crosses the network at most M times, however many of its k experts live there. This is
chapter 1's two-level idea (only one rank per node pair crosses the slow links, then the fast links fan
out) applied to the all-to-all. On rank r of node a, in-node index l = r mod m:

1. inter-node dispatch: one row per (token, destination node b), to rank b*m + l. The row carries the
   token's d values and its k gates (0 for experts on other nodes); a second, integer all-to-all carries
   which experts (-1 for other nodes). A token's row for its own node stays on its rank.
2. intra-node dispatch: the forwarding rank sends each (row, expert) pair to the rank of its node that
   holds the expert, sorted by expert, with per-expert counts, exactly like chapter 6's flat layer.
3. experts, then intra-node combine (the reverse of 2); the forwarding rank weights each result by its
   gate and adds up the results of one row, so that
4. inter-node combine (the reverse of 1) sends back one row per (token, node), not one per expert.

Both steps are `all_to_all_single` calls on the whole expert-parallel `group` whose split sizes are zero
outside the step's peers (ranks with index l on other nodes; ranks of the same node), so no extra
process group is needed, every rank number is a position in `group`, and `distlab.comm_log` counts
each step under its own label ("dispatch/inter", "dispatch/intra", "combine/intra", "combine/inter").
`dispatch="flat"` runs the same routing through one all-to-all per direction (one row per assignment,
labelled "dispatch/flat" and "combine/flat"), for the comparison. Both are differentiable through
`expert_parallel.AllToAll`; every rank runs every expert even on zero rows, so every rank joins every
backward all-to-all.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import where
from distlab.mesh import group_rank, group_size
from distlab.moe.expert_parallel import _all_to_all_single, all_to_all
from distlab.moe.gating import Router, Routing, check_tokens, load_balancing_loss
from distlab.moe.layer import ExpertFFN
from distlab.moe.node_limited import NodeLayout, NodeLimitedMoE, node_limited_gating

DISPATCHES = ("hierarchical", "flat")


@dataclass
class DispatchStats:
    """Rows one forward pass of this rank sent to ranks of other nodes and of its own node, per direction:
    `*_dispatch` rows of the dispatch, `*_combine` of the combine; `row_bytes` of a combine row, and the
    extra bytes a dispatch row carries (`dispatch_extra`: the gates, and the expert ids of the
    integer all-to-all; 0 for flat dispatch)."""

    mode: str
    cross_dispatch: int
    cross_combine: int
    local_dispatch: int
    local_combine: int
    row_bytes: int
    dispatch_extra: int

    @property
    def cross_node_bytes(self) -> int:
        """Bytes this rank sent across nodes in the forward pass (dispatch and combine)."""
        dispatch = self.cross_dispatch * (self.row_bytes + self.dispatch_extra)
        return dispatch + self.cross_combine * self.row_bytes


@dataclass
class HierarchicalOutput:
    y: Tensor
    aux_loss: Tensor
    routing: Routing
    stats: DispatchStats


def _exchange_counts(counts: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """A fixed-size all-to-all of counts (equal chunks), so every receiver can size its buffer."""
    out = torch.empty_like(counts)
    with where("counts"):
        _all_to_all_single(out, counts, None, None, group)
    return out


class HierarchicalMoE(nn.Module):
    """Dropless, node-limited MoE with its experts over the ranks of `group` (module docstring)."""

    def __init__(self, d_model: int, d_hidden: int, num_experts: int, k: int, ranks_per_node: int,
                 max_nodes: int | None = None, normalize: bool = True, dispatch: str = "hierarchical",
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if dispatch not in DISPATCHES:
            raise ValueError(f"dispatch={dispatch!r} is not known; choose one of {', '.join(DISPATCHES)}")
        self.group, self.dispatch, self.normalize = group, dispatch, normalize
        self.layout = NodeLayout(num_experts, group_size(group), ranks_per_node, k, max_nodes)
        self.rank = group_rank(group, "expert-parallel group")
        self.router = Router(d_model, num_experts)
        el = self.layout.experts_per_rank
        self.experts = nn.ModuleList(ExpertFFN(d_model, d_hidden) for _ in range(el))

    @property
    def first_expert(self) -> int:
        return self.rank * self.layout.experts_per_rank

    @classmethod
    def from_reference(cls, ref: NodeLimitedMoE, dispatch: str = "hierarchical",
                       group: dist.ProcessGroup | None = None) -> HierarchicalMoE:
        """This rank's share of the single-process layer: its router and its E/p experts, copied."""
        lay, d_model = ref.layout, ref.router.w_g.in_features
        layer = cls(d_model, ref.experts[0].w_in.out_features, lay.num_experts, lay.k, lay.ranks_per_node,
                    lay.max_nodes, ref.normalize, dispatch, group)
        if layer.layout.world_size != lay.world_size:
            raise ValueError(f"the reference was laid out for world_size={lay.world_size}, but the group has "
                             f"{layer.layout.world_size} ranks; build it with NodeLayout(..., "
                             f"world_size={layer.layout.world_size}, ...)")
        layer.router = copy.deepcopy(ref.router)
        first = layer.first_expert
        layer.experts = nn.ModuleList(copy.deepcopy(e) for e in ref.experts[first:first + len(layer.experts)])
        return layer

    def forward(self, x: Tensor) -> HierarchicalOutput:
        """x: (..., d_model), this rank's tokens -> this rank's outputs, the routing, what was sent."""
        check_tokens(x, self.router.w_g.weight)
        tokens = x.reshape(-1, x.shape[-1])
        routing = node_limited_gating(self.router(tokens), self.layout, self.normalize)
        run = self._hierarchical if self.dispatch == "hierarchical" else self._flat
        y, stats = run(tokens, routing)
        return HierarchicalOutput(y.reshape(x.shape), load_balancing_loss(routing), routing, stats)

    # -- the experts on this rank, behind an exchange that moves (row, expert) pairs sorted by expert ------

    def _expert_exchange(self, rows: Tensor, expert: Tensor, label: str
                         ) -> tuple[Tensor, list[int], list[int]]:
        """Send rows[i] to the rank of expert[i] (expert-sorted), run the experts, return the results in
        the same order, and the rows sent to and received from each rank. One all-to-all each way,
        labelled `label`."""
        p, el = self.layout.world_size, self.layout.experts_per_rank
        order = torch.argsort(expert, stable=True)
        send_counts = torch.bincount(expert[order], minlength=self.layout.num_experts)
        recv_counts = _exchange_counts(send_counts, self.group)
        ins, outs = send_counts.view(p, el).sum(1).tolist(), recv_counts.view(p, el).sum(1).tolist()
        with where("dispatch"), where(label):
            received = all_to_all(rows[order], outs, ins, self.group)
        local = torch.repeat_interleave(torch.arange(el, device=rows.device).repeat(p), recv_counts)
        processed = torch.zeros_like(received)
        for j, ffn in enumerate(self.experts):  # every expert, even on zero rows (module docstring)
            idx = torch.nonzero(local == j, as_tuple=True)[0]
            processed = processed.index_copy(0, idx, ffn(received[idx]))
        with where("combine"), where(label):
            back = all_to_all(processed, ins, outs, self.group)
        return torch.zeros_like(back).index_copy(0, order, back), ins, outs

    def _node_split(self, per_rank: list[int]) -> tuple[int, int]:
        """(rows to or from ranks of other nodes, rows to or from other ranks of this node)."""
        node = self.rank // self.layout.ranks_per_node
        m = self.layout.ranks_per_node
        cross = sum(n for j, n in enumerate(per_rank) if j // m != node)
        local = sum(n for j, n in enumerate(per_rank) if j // m == node and j != self.rank)
        return cross, local

    def _flat(self, tokens: Tensor, routing: Routing) -> tuple[Tensor, DispatchStats]:
        token, choice = torch.nonzero(routing.kept, as_tuple=True)
        expert = routing.expert_index[token, choice]
        back, sent, received = self._expert_exchange(tokens[token], expert, "flat")
        y = torch.zeros_like(tokens).index_add(0, token, routing.gates[token, choice].unsqueeze(-1) * back)
        (cross, local), (cross_back, local_back) = self._node_split(sent), self._node_split(received)
        row = tokens.shape[1] * tokens.element_size()
        return y, DispatchStats("flat", cross, cross_back, local, local_back, row, 0)

    def _hierarchical(self, tokens: Tensor, routing: Routing) -> tuple[Tensor, DispatchStats]:
        lay, d, k = self.layout, tokens.shape[1], self.layout.k
        m, p, index = lay.ranks_per_node, lay.world_size, self.rank % lay.ranks_per_node
        node_of = lay.node_of(routing.expert_index)                                  # (T, k)
        hit = torch.zeros(tokens.shape[0], lay.nodes, dtype=torch.bool, device=tokens.device)
        hit.scatter_(1, node_of, routing.kept)
        token, node = torch.nonzero(hit, as_tuple=True)
        order = torch.argsort(node, stable=True)                                      # by destination
        token, node = token[order], node[order]
        mine = node_of[token] == node.unsqueeze(1)                                    # (P, k)
        gates = routing.gates[token] * mine
        ids = torch.where(mine, routing.expert_index[token], -1).to(torch.int32)
        # 1. inter-node dispatch: one row per (token, node), to the rank with my in-node index there.
        send = torch.bincount(node * m + index, minlength=p)
        recv = _exchange_counts(send, self.group)
        ins, outs = send.tolist(), recv.tolist()
        with where("dispatch"), where("inter"):
            payload = all_to_all(torch.cat([tokens[token], gates.to(tokens.dtype)], 1), outs, ins, self.group)
            recv_ids = ids.new_empty((sum(outs), k))
            _all_to_all_single(recv_ids, ids, outs, ins, self.group)
        # 2.-3. intra-node: each (row, expert) pair to the expert's rank, and back; weight and add per row.
        row, choice = torch.nonzero(recv_ids >= 0, as_tuple=True)
        back, sent, received = self._expert_exchange(payload[row, :d], recv_ids[row, choice].long(), "intra")
        weighted = payload[row, d + choice].unsqueeze(-1) * back
        combined = torch.zeros_like(payload[:, :d]).index_add(0, row, weighted)
        # 4. inter-node combine: one row per (token, node) back to where it came from.
        with where("combine"), where("inter"):
            returned = all_to_all(combined, ins, outs, self.group)
        y = torch.zeros_like(tokens).index_add(0, token, returned)
        (cross, _), (cross_back, _) = self._node_split(ins), self._node_split(outs)
        (_, local), (_, local_back) = self._node_split(sent), self._node_split(received)
        extra = k * (tokens.element_size() + ids.element_size())
        stats = DispatchStats("hierarchical", cross, cross_back, local, local_back, d * tokens.element_size(),
                              extra)
        return y, stats
