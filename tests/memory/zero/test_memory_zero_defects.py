"""The chapter's `ZeRO` engine treats gradients as `torch.optim.Adam` does, in every stage and dtype.

Each case trains on 2 ranks (each rank half of the batch) and on one process with `torch.optim.Adam` on
the whole batch, and compares the parameters. All cases run in one start of 2 ranks.

- stale gradient: step 0 uses both linears, step 1 only `a`; torch leaves `b` where step 0 put it.
- dtype: float64 (to 1e-12) and bfloat16 (to bf16's resolution: ZeRO keeps Adam's state in fp32 where
  torch keeps it in bf16, so they differ by rounding of the update, about one bf16 ulp of the parameter).
- accumulation: two backward passes before `step()` sum the gradients, as autograd does.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from distlab import launch

STAGES = (0, 1, 2, 3)
TOL = {torch.float64: {"atol": 1e-12, "rtol": 1e-12}, torch.float32: {"atol": 1e-6, "rtol": 1e-5},
       torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def _model(dtype: torch.dtype) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 3), nn.Linear(5, 3)).to(dtype)


def _batch(step: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(8, 5, generator=torch.Generator().manual_seed(step)).to(dtype)


def _loss(model: nn.Sequential, x: torch.Tensor, step: int, plan: str) -> torch.Tensor:
    """`stale`: both layers at step 0, only layer 0 afterwards; otherwise both, always."""
    a, b = model[0], model[1]
    loss = a(x).pow(2).mean()
    if plan != "stale" or step == 0:
        loss = loss + b(x).sin().mean()
    return loss


def _train(model: nn.Sequential, step_fn, zero_grad_fn, x_of, plan: str, steps: int = 3) -> None:
    for step in range(steps):
        zero_grad_fn()
        x = x_of(step)
        micro = (x[: len(x) // 2], x[len(x) // 2:]) if plan == "accumulate" else (x,)
        for m in micro:  # mean over equal halves, summed: the scale differs from the mean by 1/len(micro)
            _loss(model, m, step, plan).backward()
        step_fn()


def _on_ranks() -> dict:
    import torch.distributed as dist

    from distlab.memory.zero import ZeRO

    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for plan, dtype in (("stale", torch.float32), ("dtype", torch.float64), ("dtype", torch.bfloat16),
                        ("accumulate", torch.float32)):
        for stage in STAGES:
            model = _model(dtype)
            engine = ZeRO(model, stage, lr=1e-2)
            half = slice(r * 8 // n, (r + 1) * 8 // n)
            _train(model, engine.step, engine.zero_grad, lambda s, d=dtype, h=half: _batch(s, d)[h], plan)
            out[plan, dtype, stage] = {k: v.float() for k, v in engine.full_parameters().items()}
            engine.remove()
    return out


def _reference(plan: str, dtype: torch.dtype) -> dict:
    model = _model(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    # one process sees the whole batch; for "accumulate", its halves are 4 rows each as on the ranks
    _train(model, opt.step, opt.zero_grad, lambda s: _batch(s, dtype), plan)
    return {k: v.detach().float() for k, v in model.named_parameters()}


@functools.cache
def _results() -> dict:
    return launch.run(_on_ranks, 2, timeout=120.0)[0]


@pytest.mark.parametrize("plan,dtype", [("stale", torch.float32), ("dtype", torch.float64),
                                        ("dtype", torch.bfloat16), ("accumulate", torch.float32)])
def test_engine_matches_torch_adam(plan: str, dtype: torch.dtype) -> None:
    ref = _reference(plan, dtype)
    for stage in STAGES:
        got = _results()[plan, dtype, stage]
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], **TOL[dtype], msg=f"stage {stage}: {name}")


def test_adam_hyper_parameters_are_checked() -> None:
    from distlab.memory.zero.flat import AdamConfig

    with pytest.raises(ValueError, match=r"eps=-1 must be a finite number >= 0"):
        AdamConfig(eps=-1)
    with pytest.raises(ValueError, match=r"weight_decay=nan must be a finite number >= 0"):
        AdamConfig(weight_decay=float("nan"))
