"""Auxiliary-loss-free load balancing: a per-expert bias that steers the choice, moved by the load.

Switch's auxiliary loss (`gating.load_balancing_loss`) balances the load through a gradient that also
pulls on the router's task gradient; weigh it too little and the router collapses, too much and the
task suffers. Wang et al. (2024, sec. 3) balance without a loss. Each expert i has a bias b_i that is
added to its routing score for the top-k *selection* only; the gate that weights the expert's output is
still the unbiased score. After each step the bias moves by a fixed amount against the load error:

    b_i <- b_i + u * sign(mean_j c_j - c_i)

with c_i the assignments expert i received in the step and u the update rate (Wang et al. 2024,
Algorithm 1; DeepSeek-AI 2024, sec. 2.1.2, uses it with u = 0.001 for most of DeepSeek-V3's training).
An overloaded expert's bias falls until fewer tokens pick it; no gradient is involved, so the bias is a
buffer, not a parameter. DeepSeek-V3 scores experts with a sigmoid; this course's router uses the
softmax of chapter 6, and the bias is added to those probabilities.

`AuxFreeMoELayer` is chapter 6's `MoELayer` with biased selection (capacity and drop order unchanged);
`train_aux_free` trains it with `load_balance.train_block`, the run `load_balance.train_balance` makes
(the same skewed tokens, block, target and seeds), so the three runs of `compare_balancing` differ only in
how they balance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distlab.moe.gating import Routing, expert_capacity, priority_positions
from distlab.moe.layer import MoELayer
from distlab.moe.load_balance import BalanceHistory, train_balance, train_block


def update_bias(bias: Tensor, load: Tensor, rate: float) -> Tensor:
    """One step of Wang et al. (2024, Algorithm 1): b + u * sign(mean load - load), returned as new."""
    if not rate >= 0:
        raise ValueError(f"rate={rate!r} must be >= 0 (u, the bias update rate; DeepSeek-V3 uses 0.001)")
    if bias.shape != load.shape:
        raise ValueError(f"bias has shape {tuple(bias.shape)} but load has {tuple(load.shape)}: one entry "
                         "per expert in both")
    load = load.to(bias.dtype)
    return bias + rate * torch.sign(load.mean() - load)


def biased_top_k_gating(logits: Tensor, bias: Tensor, k: int, capacity_factor: float,
                        normalize: bool = True) -> Routing:
    """`gating.top_k_gating` with the top-k taken over probs + bias; gates from the probabilities alone."""
    t, e = logits.shape
    if bias.shape != (e,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}; it needs one entry per expert, ({e},)")
    probs = torch.softmax(logits, dim=-1)
    expert_index = (probs.detach() + bias.to(probs.dtype)).topk(k, dim=-1).indices
    chosen = probs.gather(1, expert_index)
    gates = chosen / chosen.sum(-1, keepdim=True) if (normalize and k > 1) else chosen
    capacity = expert_capacity(t, e, k, capacity_factor)
    position = priority_positions(expert_index, e)
    kept = position < capacity
    return Routing(probs, expert_index, gates * kept, position, kept, capacity)


class AuxFreeMoELayer(MoELayer):
    """`MoELayer` whose selection adds the buffer `expert_bias` (updated by the caller: `update_bias`)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.register_buffer("expert_bias", torch.zeros(self.num_experts))

    def route(self, x: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Routing]:
        logits = self.router(x, generator)
        return logits, biased_top_k_gating(logits, self.expert_bias, self.k, self.capacity_factor,
                                           self.normalize)


def train_aux_free(rate: float, steps: int = 120, num_experts: int = 8, k: int = 1,
                   capacity_factor: float = 1.25, skew: float = 1.0, tokens_per_step: int = 256,
                   d_model: int = 16, d_hidden: int = 32, lr: float = 1e-2, seed: int = 0) -> BalanceHistory:
    """`load_balance.train_balance`'s run with no auxiliary loss in the objective and the bias updated by
    `rate` after every step from the assignments each expert *wanted* (before capacity). The history's
    aux_loss is Switch's loss, recorded only to compare."""

    def rebalance(layer: MoELayer, wanted: Tensor) -> None:
        layer.expert_bias = update_bias(layer.expert_bias, wanted, rate)

    return train_block(lambda: AuxFreeMoELayer(d_model, d_hidden, num_experts, k, capacity_factor), steps,
                       skew, tokens_per_step, lr, seed, rebalance=rebalance)


def compare_balancing(steps: int = 120, aux_weight: float = 1e-2, rate: float = 1e-2, last: int = 20,
                      **kwargs: object) -> dict[str, dict[str, float]]:
    """Train without balancing, with Switch's loss (aux_weight) and aux-loss-free (rate), on the same
    task; per run, the mean over the `last` steps of the imbalance (busiest expert's load over the mean),
    the dropped fraction, and the task loss (MSE, without the auxiliary term)."""
    runs = {"none": train_balance(0.0, steps, **kwargs),  # type: ignore[arg-type]
            "switch aux loss": train_balance(aux_weight, steps, **kwargs),  # type: ignore[arg-type]
            "aux-loss-free": train_aux_free(rate, steps, **kwargs)}  # type: ignore[arg-type]
    return {name: {"imbalance": float(h.imbalance()[-last:].mean()),
                   "dropped": sum(h.dropped[-last:]) / last,
                   "task loss": sum(h.task_loss[-last:]) / last} for name, h in runs.items()}
