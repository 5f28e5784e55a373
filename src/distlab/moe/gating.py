"""Gating: the router, top-k selection, expert capacity, dropping, and the auxiliary losses.

A router is one linear map from a token's d_model features to one logit per expert. Everything after it
is plain tensor arithmetic on those logits, written here as small functions so that the single-process
layer (`layer.py`) and the expert-parallel one (`expert_parallel.py`) route tokens identically:

1. `top_k_gating`: softmax over all E experts, keep the k largest probabilities (k = 1 as in the
   Switch Transformer, Fedus, Zoph & Shazeer 2022, sec. 2.1; k = 2 as in GShard, Lepikhin et al. 2021,
   sec. 2.2), renormalise the k gates to sum to 1 when k > 1 (GShard's Algorithm 1 does this for its
   top-2; Switch keeps the raw probability p_i, which is what lets the router learn with k = 1).
2. Capacity: each expert takes at most C = ceil(k * T / E * capacity_factor) tokens from a group of T
   tokens (`expert_capacity`). With k = 1 this is Switch's (tokens per batch / experts) x capacity
   factor, rounded up; with k = 2 and capacity_factor = 1 it is GShard's 2S/E per group of S tokens.
3. Dropping, with a fixed priority: all first choices in token order, then all second choices in token
   order, and so on (the order of GShard's Algorithm 1). An assignment whose position in its expert's
   buffer is >= C is dropped: its gate becomes 0, and a token dropped by every choice leaves the layer
   as zeros, so only the residual connection around the layer carries it (Fedus et al. 2022, sec. 2.2).
4. `load_balancing_loss`: Switch's N * sum_i f_i * P_i (eq. 4), with f_i the fraction of tokens whose
   first choice is expert i and P_i the mean router probability of expert i; it is 1 when both are
   uniform. `router_z_loss`: the mean squared log-sum-exp of the logits (Zoph et al. 2022, ST-MoE).

Noisy top-k (Shazeer et al. 2017, sec. 2.1) adds Gaussian noise scaled by softplus(x W_noise) to the
logits before the top-k, in training only; `Router(noisy=True)` does this with an explicit generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def check_moe_config(num_experts: int, k: int, capacity_factor: float, world_size: int = 1, *,
                     d_model: int = 1, d_hidden: int = 1) -> None:
    """Validate the layer's shape at the boundary; raise a ValueError that names the value and the fix."""
    for name, value in (("d_model", d_model), ("d_hidden", d_hidden)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer (a width of the experts), "
                             f"e.g. {name}=64")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts={num_experts!r} must be a positive integer, e.g. num_experts=8")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be a positive integer (experts per token), e.g. k=1 or k=2")
    if k > num_experts:
        raise ValueError(f"k={k} is larger than num_experts={num_experts}: a token cannot pick more experts "
                         f"than exist; choose k <= {num_experts}")
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) \
            or not math.isfinite(capacity_factor) or capacity_factor <= 0:
        raise ValueError(f"capacity_factor={capacity_factor!r} must be a positive number; 1.0 gives every "
                         "expert exactly its even share, 1.25 (Switch's default) leaves 25% slack")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive integer (ranks in the "
                         "expert-parallel group)")
    if num_experts % world_size:
        lower = num_experts // world_size * world_size
        near = " or ".join(str(n) for n in (lower, lower + world_size) if n > 0)
        divisors = [d for d in range(1, num_experts + 1) if num_experts % d == 0]
        raise ValueError(f"num_experts={num_experts} is not divisible by world_size={world_size}: expert "
                         f"parallelism gives every rank the same number of experts; choose num_experts a "
                         f"multiple of {world_size} (e.g. {near}) or a world size in {divisors}")


def check_tokens(x: Tensor, weight: Tensor) -> None:
    """Raise a ValueError unless x is (..., d_model) floating-point tokens of the router weight's dtype."""
    d_model = weight.shape[-1]
    if not x.is_floating_point():
        raise ValueError(f"tokens x have dtype {x.dtype}; a MoE layer takes floating-point activations "
                         f"(..., d_model={d_model}), not token ids: embed them first, or convert with "
                         f"x.to({weight.dtype})")
    if x.dtype != weight.dtype:
        raise ValueError(f"tokens x have dtype {x.dtype} but the layer's weights are {weight.dtype}; convert "
                         f"one of them, e.g. x.to({weight.dtype}) or layer.to({x.dtype})")
    if x.dim() < 1 or x.shape[-1] != d_model:
        raise ValueError(f"tokens x have shape {tuple(x.shape)}; the last dimension must be "
                         f"d_model={d_model}")


def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float) -> int:
    """C = ceil(k * T / E * capacity_factor): the most tokens one expert takes from a group of T tokens.

    Fedus et al. 2022, sec. 2.2 (k = 1: tokens per batch / experts x capacity factor); Lepikhin et al.
    2021, sec. 2.2 (k = 2: 2S/E per group of S tokens). Never more than T (an expert sees each token once).
    """
    check_moe_config(num_experts, k, capacity_factor)
    if num_tokens < 0:
        raise ValueError(f"num_tokens={num_tokens} must be >= 0")
    # round() first so that e.g. 1.1 * 10 = 11.000000000000002 does not round up to 12
    return min(num_tokens, math.ceil(round(k * num_tokens / num_experts * capacity_factor, 9)))


@dataclass
class Routing:
    """Where each token goes. T tokens, k choices, E experts.

    probs: (T, E) softmax of the router logits (before any top-k), differentiable.
    expert_index: (T, k) the chosen experts, best first.
    gates: (T, k) the weights the experts' outputs get: the chosen probabilities, renormalised when
        k > 1 and `normalize`, and 0 where the assignment was dropped. Differentiable.
    position: (T, k) the slot of each assignment in its expert's buffer, in priority order.
    kept: (T, k) bool, position < capacity.
    capacity: C, per expert, for this group.
    """

    probs: Tensor
    expert_index: Tensor
    gates: Tensor
    position: Tensor
    kept: Tensor
    capacity: int

    @property
    def num_experts(self) -> int:
        return self.probs.shape[-1]

    def tokens_per_expert(self, kept_only: bool = True) -> Tensor:
        """(E,) assignments each expert receives (after dropping, or before with kept_only=False)."""
        idx = self.expert_index[self.kept] if kept_only else self.expert_index.reshape(-1)
        return torch.bincount(idx, minlength=self.num_experts)

    def dropped_fraction(self) -> float:
        """Fraction of the T*k assignments dropped for lack of capacity."""
        return 1.0 - float(self.kept.float().mean()) if self.kept.numel() else 0.0

    def combine_weights(self) -> Tensor:
        """(T, E) dense form: weight of expert e's output in token t's result (0 if not chosen or dropped)."""
        dense = self.gates.new_zeros(self.probs.shape)
        return dense.scatter_add(1, self.expert_index, self.gates)


def priority_positions(expert_index: Tensor, num_experts: int) -> Tensor:
    """Slot of each (token, choice) in its expert's buffer: first choices in token order, then second
    choices, ... (Lepikhin et al. 2021, Algorithm 1). expert_index (T, k) -> position (T, k)."""
    t, k = expert_index.shape
    one_hot = F.one_hot(expert_index.t().reshape(-1), num_experts)  # (k*T, E), choice-major order
    position = (one_hot.cumsum(0) - 1).gather(1, expert_index.t().reshape(-1, 1))
    return position.reshape(k, t).t()


def top_k_gating(logits: Tensor, k: int, capacity_factor: float, normalize: bool = True,
                 capacity: int | None = None) -> Routing:
    """Route T tokens from their (T, E) router logits: softmax, top-k, capacity, dropping (module docstring).

    `capacity` overrides the one computed from `capacity_factor` (used by tests and the exercise).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (tokens, experts), got {tuple(logits.shape)}")
    t, e = logits.shape
    check_moe_config(e, k, capacity_factor)
    probs = torch.softmax(logits, dim=-1)
    top_probs, expert_index = probs.topk(k, dim=-1)
    gates = top_probs / top_probs.sum(-1, keepdim=True) if (normalize and k > 1) else top_probs
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0):
        raise ValueError(f"capacity={capacity!r} must be a non-negative integer (tokens per expert), or "
                         "None to compute it from capacity_factor")
    c = expert_capacity(t, e, k, capacity_factor) if capacity is None else capacity
    position = priority_positions(expert_index, e)
    kept = position < c
    return Routing(probs, expert_index, gates * kept, position, kept, c)


def load_balancing_loss(routing: Routing) -> Tensor:
    """Switch Transformer's auxiliary loss N * sum_i f_i * P_i (Fedus et al. 2022, eq. 4).

    f_i: fraction of tokens whose first choice is expert i (before dropping; not differentiable).
    P_i: mean over tokens of the router probability of expert i (differentiable). Equals 1 when routing
    is uniform, and N when every token goes to one expert with probability 1. Multiply by alpha (Switch
    uses 1e-2) before adding it to the task loss.
    """
    e = routing.num_experts
    first = routing.expert_index[:, 0]
    f = torch.bincount(first, minlength=e).to(routing.probs.dtype) / max(1, first.numel())
    p = routing.probs.mean(0) if routing.probs.shape[0] else routing.probs.new_zeros(e)
    return e * (f * p).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's router z-loss: mean over tokens of (log sum_j exp(logit_j))^2 (Zoph et al. 2022, ST-MoE).

    It keeps the logits small, where the softmax is numerically tame; ST-MoE weights it by 1e-3.
    """
    if logits.shape[0] == 0:
        return logits.new_zeros(())
    return torch.logsumexp(logits, dim=-1).square().mean()


class Router(nn.Module):
    """The gating network: logits = x W_g (no bias, as in Switch), optionally noisy (Shazeer et al. 2017).

    With noisy=True and in training mode, logits + N(0, 1) * softplus(x W_noise), the noise drawn from
    `generator` (pass one for reproducible runs). In eval mode the router is deterministic.
    """

    def __init__(self, d_model: int, num_experts: int, noisy: bool = False) -> None:
        super().__init__()
        self.w_g = nn.Linear(d_model, num_experts, bias=False)
        self.w_noise = nn.Linear(d_model, num_experts, bias=False) if noisy else None

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        logits = self.w_g(x)
        if self.w_noise is not None and self.training:
            eps = torch.randn(logits.shape, generator=generator, dtype=logits.dtype, device=logits.device)
            logits = logits + eps * F.softplus(self.w_noise(x))
        return logits
