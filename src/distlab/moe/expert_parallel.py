"""Expert parallelism: the E experts are split across the ranks, and tokens travel to their experts.

Rank r holds experts r*E/p .. (r+1)*E/p - 1 and the whole router (replicated, like data-parallel
weights). Every rank routes its own tokens (its own GShard group, so capacity is counted per rank:
Lepikhin et al. 2021, sec. 2.2), then one MoE layer costs two all-to-alls (Lepikhin et al. 2021;
Fedus et al. 2022, sec. 2.2):

1. counts: every rank tells every other how many rows it will send to each of that rank's experts
   (E integers per rank, a fixed-size all-to-all), so receivers can size their buffers;
2. dispatch: the kept (token, choice) rows, sorted by expert, go to the experts' ranks in one
   all-to-all with variable split sizes (`dist.all_to_all_single`);
3. each rank runs its experts on what it received;
4. combine: a second all-to-all with the split sizes swapped sends the results back, and each rank adds
   them into its tokens with the gate weights.

Every rank number here is a position in `group` (the expert-parallel process group, e.g.
`mesh["ep"].get_group()`; None = the whole world, or one process without torch.distributed): rank r of
the group holds experts r*E/p .., the split sizes are indexed by group rank, and the all-to-alls run
inside the group, so the layer runs unchanged on one dim of a larger mesh.

Autograd: `AllToAll` is a torch.autograd.Function whose backward is the reverse all-to-all (the
gradient of a permutation of rows is the inverse permutation), so the backward pass of one layer costs
two more all-to-alls. Routing is identical to `MoELayer(..., group_sizes=tokens per rank)`, so outputs
and gradients match the single-process reference (tests/moe/test_moe.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import where
from distlab.mesh import group_rank, group_size
from distlab.moe.gating import (
    Router,
    Routing,
    check_moe_config,
    check_tokens,
    load_balancing_loss,
    router_z_loss,
    top_k_gating,
)
from distlab.moe.layer import ExpertFFN, MoELayer


def _all_to_all_single(out: Tensor, x: Tensor, output_split_sizes: list[int] | None,
                       input_split_sizes: list[int] | None, group: dist.ProcessGroup | None) -> None:
    """dist.all_to_all_single, or a copy for a group of one process (no torch.distributed needed)."""
    if group_size(group) == 1:
        out.copy_(x)
    else:
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes, input_split_sizes, group=group)


class AllToAll(torch.autograd.Function):
    """all_to_all_single with variable split sizes, differentiable: backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x: Tensor, output_split_sizes: list[int], input_split_sizes: list[int],  # type: ignore[override]
                group: dist.ProcessGroup | None) -> Tensor:
        ctx.splits, ctx.group = (output_split_sizes, input_split_sizes), group
        out = x.new_empty((sum(output_split_sizes), *x.shape[1:]))
        _all_to_all_single(out, x, output_split_sizes, input_split_sizes, group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        output_split_sizes, input_split_sizes = ctx.splits
        back = grad.new_empty((sum(input_split_sizes), *grad.shape[1:]))
        _all_to_all_single(back, grad, input_split_sizes, output_split_sizes, ctx.group)
        return back, None, None, None


def all_to_all(x: Tensor, output_split_sizes: list[int], input_split_sizes: list[int],
               group: dist.ProcessGroup | None = None) -> Tensor:
    """Rows input_split_sizes[j] of x go to rank j of `group`; output_split_sizes[j] rows arrive from it."""
    return AllToAll.apply(x, list(output_split_sizes), list(input_split_sizes), group)


@dataclass
class AllToAllStats:
    """What one forward pass sent: rows to each rank (send_rows[j]) and from each rank (recv_rows[j]),
    the bytes of one row, and the bytes of the counts exchange. `bytes_sent` counts the payload that
    left this rank in *one* all-to-all (the row to itself stays home); combine sends back as much as
    dispatch received."""

    rank: int
    send_rows: list[int]
    recv_rows: list[int]
    row_bytes: int
    count_bytes: int

    @property
    def bytes_sent(self) -> int:
        return sum(n for j, n in enumerate(self.send_rows) if j != self.rank) * self.row_bytes

    @property
    def bytes_received(self) -> int:
        return sum(n for j, n in enumerate(self.recv_rows) if j != self.rank) * self.row_bytes


@dataclass
class ExpertParallelOutput:
    """This rank's output rows, its group's losses, routing, and what its all-to-alls carried."""

    y: Tensor
    aux_loss: Tensor
    z_loss: Tensor
    routing: Routing
    comm: AllToAllStats


class ExpertParallelMoE(nn.Module):
    """The MoE layer with its experts spread over the ranks of `group` (None: the whole world, or one
    process without torch.distributed); `rank` and `world_size` are this rank's position in the group
    and the group's size.

    Gradients: the router is replicated, so the caller all-reduces its gradient like any data-parallel
    weight (sum, as `check.parity_one` does). The experts' gradients are already complete sums over every
    rank's tokens (the backward all-to-all delivers them); under DDP-style averaging of the ranks' losses
    divide them by the world size too.
    """

    def __init__(self, d_model: int, d_hidden: int, num_experts: int, k: int = 1,
                 capacity_factor: float = 1.25, normalize: bool = True, noisy: bool = False,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.group = group
        check_moe_config(num_experts, k, capacity_factor, self.world_size, d_model=d_model, d_hidden=d_hidden)
        self.num_experts, self.k = num_experts, k
        self.capacity_factor, self.normalize = capacity_factor, normalize
        self.experts_per_rank = num_experts // self.world_size
        self.router = Router(d_model, num_experts, noisy)
        self.experts = nn.ModuleList(ExpertFFN(d_model, d_hidden) for _ in range(self.experts_per_rank))

    @property
    def world_size(self) -> int:
        """p, the size of the expert-parallel group."""
        return group_size(self.group)

    @property
    def rank(self) -> int:
        """This rank's position in the expert-parallel group."""
        return group_rank(self.group)

    @property
    def first_expert(self) -> int:
        """The global index of this rank's first expert, rank * E/p."""
        return self.rank * self.experts_per_rank

    @classmethod
    def from_reference(cls, ref: MoELayer, group: dist.ProcessGroup | None = None) -> ExpertParallelMoE:
        """This rank's share of a single-process layer: a copy of its router and of its E/p experts."""
        d_model, num_experts = ref.router.w_g.in_features, ref.num_experts
        d_hidden = ref.experts[0].w_in.out_features
        layer = cls(d_model, d_hidden, num_experts, ref.k, ref.capacity_factor, ref.normalize,
                    ref.router.w_noise is not None, group)
        layer.router = copy.deepcopy(ref.router)
        first, last = layer.first_expert, layer.first_expert + layer.experts_per_rank
        layer.experts = nn.ModuleList(copy.deepcopy(e) for e in ref.experts[first:last])
        return layer.to(next(ref.parameters()).device)

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> ExpertParallelOutput:
        """x: (..., d_model), this rank's tokens; returns this rank's outputs (module docstring)."""
        check_tokens(x, self.router.w_g.weight)
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        p, el = self.world_size, self.experts_per_rank
        logits = self.router(tokens, generator)
        routing = top_k_gating(logits, self.k, self.capacity_factor, self.normalize)

        # The kept assignments, sorted by expert (so by destination rank), then by buffer position.
        token, choice = torch.nonzero(routing.kept, as_tuple=True)
        expert = routing.expert_index[token, choice]
        order = torch.argsort(expert * (routing.capacity + 1) + routing.position[token, choice])
        token, choice, expert = token[order], choice[order], expert[order]

        # 1. counts: send_counts[e] rows for expert e; recv_counts[s * el + j]: rows from rank s for my j.
        send_counts = torch.bincount(expert, minlength=self.num_experts)
        recv_counts = torch.empty_like(send_counts)
        _all_to_all_single(recv_counts, send_counts, None, None, self.group)
        input_splits = send_counts.view(p, el).sum(1).tolist()
        output_splits = recv_counts.view(p, el).sum(1).tolist()

        # 2. dispatch, 3. experts, 4. combine.
        with where("dispatch"):  # the label an open distlab.comm_log gives these calls
            received = all_to_all(tokens[token], output_splits, input_splits, self.group)
        local_expert = torch.repeat_interleave(torch.arange(el, device=x.device).repeat(p), recv_counts)
        processed = torch.zeros_like(received)
        for j, ffn in enumerate(self.experts):
            # Run every expert, even on zero rows: then every rank's combine all-to-all is in the autograd
            # graph, and every rank joins its backward (a rank that skipped it would leave the others
            # waiting in the collective).
            rows = torch.nonzero(local_expert == j, as_tuple=True)[0]
            processed = processed.index_copy(0, rows, ffn(received[rows]))
        with where("combine"):
            returned = all_to_all(processed, input_splits, output_splits, self.group)
        gate = routing.gates[token, choice].unsqueeze(-1).to(x.dtype)
        y = torch.zeros_like(tokens).index_add(0, token, gate * returned)

        comm = AllToAllStats(self.rank, input_splits, output_splits, tokens.shape[1] * tokens.element_size(),
                             send_counts.numel() * send_counts.element_size())
        return ExpertParallelOutput(y.reshape(shape), load_balancing_loss(routing), router_z_loss(logits),
                                    routing, comm)
