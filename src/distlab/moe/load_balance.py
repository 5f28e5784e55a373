"""Experiments on one process: skewed synthetic tokens, drop rate against capacity, and whether the
load-balancing loss evens out the load during a short training run. The figures (`figures.py`), the
lab and the tests all call these functions, so they show the same numbers.

The tokens are x = skew * u + z, with z ~ N(0, I) and u one fixed unit vector scaled to length
sqrt(d_model). With skew = 0 a random router spreads them evenly; as skew grows, the direction that every
token shares dominates the router's logits u W_g, and most tokens pick the same expert: skewed expert
load, the situation the auxiliary loss of Fedus et al. (2022, sec. 2.2) is for. A router *can* balance
them (the z part differs from token to token), if something makes it learn to.

The experiments compute in float64 (the tokens are drawn in float32, then widened): in float32 a router
logit that is within rounding of another can pick a different expert on another CPU or thread count, and
the drop rates and the training run would then differ from machine to machine; in float64 they do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from distlab.moe.gating import Router, check_moe_config, top_k_gating
from distlab.moe.layer import MoELayer


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one CPU thread inside the block, with a forked random state, then restore both.

    These experiments use tiny tensors, for which one thread is faster than several, and is not slowed
    down (by a factor of ten or more) when other processes compete for the cores. Forking the random
    state means that seeding inside the block leaves the caller's generator as it was.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(before)


def skewed_tokens(num_tokens: int, d_model: int, skew: float, seed: int = 0) -> Tensor:
    """num_tokens float32 tokens x = skew * u + z (module docstring); u is fixed, z is drawn from `seed`."""
    if skew < 0:
        raise ValueError(f"skew={skew!r} must be >= 0 (0 = no shared direction; 1 to 3 = strongly skewed)")
    u = torch.randn(d_model, generator=torch.Generator().manual_seed(12345))
    u = u / u.norm() * d_model**0.5
    z = torch.randn(num_tokens, d_model, generator=torch.Generator().manual_seed(seed))
    return skew * u + z


def routing_counts(num_experts: int, k: int, capacity_factor: float, skew: float, num_tokens: int = 512,
                   d_model: int = 16, seed: int = 0) -> tuple[Tensor, Tensor, int]:
    """Route skewed tokens with a freshly initialised router: (wanted, kept, capacity).

    wanted[e]: assignments that chose expert e; kept[e]: those within its capacity.
    """
    with torch.no_grad(), one_thread():
        torch.manual_seed(seed)
        router = Router(d_model, num_experts).double()
        x = skewed_tokens(num_tokens, d_model, skew, seed=seed).double()
        routing = top_k_gating(router(x), k, capacity_factor)
    return routing.tokens_per_expert(False), routing.tokens_per_expert(True), routing.capacity


def drop_rate_curve(capacity_factors: Sequence[float], num_experts: int = 8, k: int = 1,
                    skew: float = 0.0, num_tokens: int = 512, d_model: int = 16,
                    seeds: Sequence[int] = (0, 1, 2)) -> list[float]:
    """Fraction of the k*T assignments dropped, for each capacity factor, averaged over routers `seeds`
    (the same routers and tokens as `routing_counts`)."""
    logits = []
    with torch.no_grad(), one_thread():
        for s in seeds:
            torch.manual_seed(s)
            router = Router(d_model, num_experts).double()
            logits.append(router(skewed_tokens(num_tokens, d_model, skew, seed=s).double()))
        return [sum(top_k_gating(z, k, cf).dropped_fraction() for z in logits) / len(logits)
                for cf in capacity_factors]


@dataclass
class BalanceHistory:
    """One training run: per step, the task loss, the aux loss, the fraction of assignments each expert
    wanted (steps x E, before dropping), and the fraction dropped."""

    task_loss: list[float]
    aux_loss: list[float]
    load: Tensor
    dropped: list[float]

    def imbalance(self) -> Tensor:
        """Per step, the busiest expert's load over the mean load (1 = perfectly balanced)."""
        return self.load.max(1).values * self.load.shape[1]


class _Block(nn.Module):
    """x -> x + MoE(x): dropped tokens pass through on the residual path."""

    def __init__(self, moe: MoELayer, d_out: int) -> None:
        super().__init__()
        self.moe, self.head = moe, nn.Linear(moe.router.w_g.in_features, d_out)

    def forward(self, x: Tensor):
        out = self.moe(x)
        return self.head(x + out.y), out


def train_block(make_layer: Callable[[], MoELayer], steps: int = 120, skew: float = 1.0,
                tokens_per_step: int = 256, lr: float = 1e-2, seed: int = 0, aux_weight: float | None = None,
                rebalance: Callable[[MoELayer, Tensor], None] | None = None) -> BalanceHistory:
    """The training run every balancing method here shares: x -> head(x + MoE(x)), the layer built by
    `make_layer` after seeding with `seed`, regresses tanh(x A) (A fixed and random) on skewed tokens, with
    Adam. The objective is MSE + aux_weight * load_balancing_loss (the MSE alone when aux_weight is None);
    after each optimizer step, `rebalance(layer, wanted)` sees the assignments each expert *wanted* (before
    capacity). Deterministic."""
    with one_thread():
        torch.manual_seed(seed)
        layer = make_layer()
        d_model = layer.router.w_g.in_features
        model = _Block(layer, d_model).double()
        a = torch.randn(d_model, d_model, generator=torch.Generator().manual_seed(seed + 1)).double()
        a = a / d_model**0.5
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        task, aux, loads, dropped = [], [], [], []
        for step in range(steps):
            x = skewed_tokens(tokens_per_step, d_model, skew, seed=1000 * seed + step + 1).double()
            pred, out = model(x)
            mse = (pred - torch.tanh(x @ a)).square().mean()
            loss = mse if aux_weight is None else mse + aux_weight * out.aux_loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            wanted = out.tokens_per_expert(kept_only=False).double()
            if rebalance is not None:
                rebalance(layer, wanted)
            task.append(float(mse.detach()))
            aux.append(float(out.aux_loss.detach()))
            loads.append(wanted / wanted.sum())
            dropped.append(out.dropped_fraction())
    return BalanceHistory(task, aux, torch.stack(loads), dropped)


def train_balance(aux_weight: float, steps: int = 120, num_experts: int = 8, k: int = 1,
                  capacity_factor: float = 1.25, skew: float = 1.0, tokens_per_step: int = 256,
                  d_model: int = 16, d_hidden: int = 32, lr: float = 1e-2, seed: int = 0) -> BalanceHistory:
    """`train_block` of chapter 6's `MoELayer` with loss = MSE + aux_weight * load_balancing_loss (Switch
    uses aux_weight = 1e-2)."""
    return train_block(lambda: MoELayer(d_model, d_hidden, num_experts, k, capacity_factor), steps, skew,
                       tokens_per_step, lr, seed, aux_weight=aux_weight)


def send_matrix(num_experts: int, k: int, capacity_factor: float, skew: float, world_size: int,
                tokens_per_rank: int = 128, d_model: int = 16, seed: int = 0) -> Tensor:
    """(p, p) rows that rank i sends to rank j in the dispatch all-to-all (combine sends the transpose
    back), computed without ranks: each rank routes its own skewed tokens with the same router, capacity
    per rank, and expert e lives on rank e // (E / p). The diagonal stays home."""
    check_moe_config(num_experts, k, capacity_factor, world_size)
    per_rank = num_experts // world_size
    rows = torch.zeros(world_size, world_size, dtype=torch.int64)
    with torch.no_grad(), one_thread():
        torch.manual_seed(seed)
        router = Router(d_model, num_experts).double()
        for r in range(world_size):
            x = skewed_tokens(tokens_per_rank, d_model, skew, seed=seed + 1 + r).double()
            kept = top_k_gating(router(x), k, capacity_factor).tokens_per_expert(True)
            rows[r] = kept.view(world_size, per_rank).sum(1)
    return rows
