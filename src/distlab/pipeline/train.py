"""A pipeline-parallel training step of `distlab.models.MLP`, and the single-process step it must equal.

`pipeline_step` runs on every rank (start it with `distlab.launch.run` or under torchrun): each rank
builds the same MLP from the same seed, keeps the stages the schedule gives it, runs the schedule on m
microbatches, and takes one SGD step on its own parameters. `reference_step` does the same step in one
process, on the whole batch: the pipeline's gradients and updated parameters must equal its.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from distlab.models import MLP
from distlab.pipeline.executor import RankRun, run_schedule
from distlab.pipeline.partition import balanced_boundaries, boundary_shapes, check_boundaries, parameter_costs
from distlab.pipeline.schedules import Schedule, make_schedule


def split_microbatches(X: Tensor, y: Tensor, m: int) -> tuple[list[Tensor], list[Tensor]]:
    """Cut a batch into m equal microbatches (equal, so that the mean of their mean losses is the mean
    loss of the batch)."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m={m!r} microbatches: use a positive integer that divides the batch size {len(X)}")
    if len(X) % m:
        divisors = [d for d in range(1, len(X) + 1) if len(X) % d == 0]
        raise ValueError(f"batch size {len(X)} is not divisible by m={m} microbatches; choose m from "
                         f"{divisors} or a batch size that is a multiple of {m}")
    return list(X.chunk(m)), list(y.chunk(m))


@dataclass
class StepResult:
    """One rank's step: its parameters' gradients and updated values (named as in the MLP's state_dict),
    and what the executor measured."""

    grads: dict[str, Tensor]
    params: dict[str, Tensor]
    run: RankRun


def pipeline_step(sizes: Sequence[int], X: Tensor, y: Tensor, schedule: Schedule, rank: int,
                  seed: int = 0, lr: float = 0.1, boundaries: Sequence[int] | None = None,
                  device: torch.device | None = None) -> StepResult:
    """One SGD step of MLP(sizes) on (X, y), pipelined by `schedule`, as seen by rank `rank`, with this
    rank's stages on `device` (the CPU by default; its GPU on NCCL). Gradients and parameters come back
    on the CPU."""
    device = device or torch.device("cpu")
    torch.manual_seed(seed)
    layers = MLP(sizes).layers
    S = schedule.num_stages
    if boundaries is None:
        bounds = balanced_boundaries(parameter_costs(layers), S)
    else:
        bounds = check_boundaries(boundaries, len(layers))
        if len(bounds) != S + 1:
            raise ValueError(f"boundaries={bounds} give {len(bounds) - 1} stages but the schedule has "
                             f"p * v = {S}; pass {S + 1} boundaries")
    xs, ys = split_microbatches(X, y, schedule.m)
    mine = {s: torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]])
            for s in range(S) if s % schedule.p == rank}
    shapes = dict(enumerate(boundary_shapes(layers, bounds, xs[0])))
    shapes[S] = torch.Size([])  # the loss: the last stage's "output" is a scalar
    for module in mine.values():
        module.to(device)
    run = run_schedule(schedule, mine, xs, ys, F.mse_loss, shapes, rank, device)
    grads, params = {}, {}
    with torch.no_grad():
        for s, module in mine.items():
            for i in range(bounds[s], bounds[s + 1]):
                for name, param in layers[i].named_parameters():
                    grads[f"{i}.{name}"] = param.grad.cpu().clone()
                    param -= lr * param.grad
                    params[f"{i}.{name}"] = param.detach().cpu().clone()
            del module
    return StepResult(grads, params, run)


def reference_step(sizes: Sequence[int], X: Tensor, y: Tensor, seed: int = 0,
                   lr: float = 0.1) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The same SGD step in one process on the whole batch: (gradients, updated parameters)."""
    torch.manual_seed(seed)
    model = MLP(sizes)
    F.mse_loss(model(X), y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def steps_on_rank(configs: Sequence[tuple[str, int, int]], sizes: Sequence[int], X: Tensor, y: Tensor,
                  seed: int = 0, lr: float = 0.1) -> list[StepResult]:
    """Run several (schedule name, m, v) steps in one launch (starting ranks costs seconds): call on
    every rank, e.g. `launch.run(steps_on_rank, p, configs, sizes, X, y)`. On NCCL the stages run on
    this rank's GPU and the schedules are built with rendezvous_safe=True."""
    from distlab import launch

    p, rank = launch.world_size(), launch.rank()
    safe = launch.backend() == "nccl"
    return [pipeline_step(sizes, X, y, make_schedule(name, p, m, v, rendezvous_safe=safe), rank, seed, lr,
                          device=launch.device())
            for name, m, v in configs]


def merge(results: Sequence[StepResult]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """All ranks' gradients and updated parameters in one pair of dicts."""
    grads: dict[str, Tensor] = {}
    params: dict[str, Tensor] = {}
    for r in results:
        grads.update(r.grads)
        params.update(r.params)
    return grads, params


def max_difference(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """The largest absolute difference between two sets of named tensors (which must have the same names)."""
    if a.keys() != b.keys():
        raise ValueError(f"different parameters: {sorted(set(a) ^ set(b))}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)
