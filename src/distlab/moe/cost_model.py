"""The arithmetic of a MoE layer: parameters against FLOPs per token, and what its all-to-alls cost.

Parameters grow with the number of experts E, but a token only meets the router and k experts, so the
compute per token grows with k, not with E (Shazeer et al. 2017, sec. 1; Fedus et al. 2022, sec. 2).
Under expert parallelism on p ranks, each of the layer's two forward all-to-alls (dispatch, combine)
moves every kept (token, choice) row whose expert lives on another rank; with T tokens per rank,
balanced routing and no drops that is k*T*(p-1)/p rows of d_model values per rank. The time follows
from chapter 1's pairwise all-to-all, (p-1) alpha + (p-1)/p n beta with n the whole send buffer
(`distlab.collectives.cost_model.pairwise_all_to_all_time`).
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.collectives.cost_model import MachineParams, pairwise_all_to_all_time
from distlab.comm_log import ring_bytes
from distlab.moe.gating import expert_capacity


def ffn_parameters(d_model: int, d_hidden: int) -> int:
    """Weights and biases of one feed-forward expert, d_model -> d_hidden -> d_model."""
    return 2 * d_model * d_hidden + d_hidden + d_model


def moe_parameters(d_model: int, d_hidden: int, num_experts: int) -> int:
    """All parameters of the layer: the router (d_model x E, no bias) and E experts."""
    return d_model * num_experts + num_experts * ffn_parameters(d_model, d_hidden)


def moe_flops_per_token(d_model: int, d_hidden: int, num_experts: int, k: int) -> int:
    """FLOPs of one token's forward pass (2 per multiply-add): the router's logits and k experts.

    A dense FFN of the same width costs 4 d_model d_hidden; the MoE costs k times that plus the router's
    2 d_model E, whatever E is (biases and the softmax are left out: they are O(d_model + E)).
    """
    return 2 * d_model * num_experts + k * 4 * d_model * d_hidden


@dataclass(frozen=True)
class AllToAllPrediction:
    """Predicted traffic of one rank in one MoE layer's forward pass, for balanced routing."""

    rows_per_all_to_all: float  # rows this rank sends to other ranks, per all-to-all
    bytes_per_all_to_all: float
    send_buffer_bytes: float  # n in the cost model: the whole send buffer, own rows included
    forward_bytes: float  # dispatch + combine
    step_bytes: float  # forward + backward: four all-to-alls
    seconds_per_all_to_all: float | None  # when machine parameters are given


def predict_all_to_all(tokens_per_rank: int, d_model: int, k: int, world_size: int,
                       bytes_per_element: int = 4, capacity_factor: float | None = None,
                       num_experts: int | None = None,
                       params: MachineParams | None = None) -> AllToAllPrediction:
    """Bytes (and, with `params`, seconds) of the layer's all-to-alls on one rank, balanced routing.

    With a capacity factor below 1 at most E*C of the k*T assignments are kept, so the rows shrink to
    E*C (num_experts is then needed). The counts exchange (E integers) is left out: it is tiny.
    """
    p = world_size
    rows = float(k * tokens_per_rank)
    if capacity_factor is not None and num_experts is not None:
        rows = min(rows, num_experts * expert_capacity(tokens_per_rank, num_experts, k, capacity_factor))
    row_bytes = d_model * bytes_per_element
    buffer = rows * row_bytes
    off_rank = ring_bytes("all_to_all", buffer, p)  # (p-1)/p of the buffer leaves the rank
    seconds = None if params is None else float(pairwise_all_to_all_time(buffer, p, params, headers=False))
    return AllToAllPrediction(ring_bytes("all_to_all", rows, p), off_rank, buffer, 2 * off_rank, 4 * off_rank,
                              seconds)
