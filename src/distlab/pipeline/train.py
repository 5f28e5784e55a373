"""A pipeline-parallel training step of `distlab.models.MLP`, and the single-process step it must equal.

`pipeline_step` runs on every rank of the pipeline's process group (start the ranks with
`distlab.launch.run` or torchrun; the group is the whole world or one dim of a `distlab.mesh` grid):
each rank builds the same MLP from the same seed, keeps the stages the schedule gives its position in the
group, runs the schedule on m microbatches, and takes one SGD step on its own parameters.
`reference_step` does the same step in one process, on the whole batch: the pipeline's loss, gradients
and updated parameters must equal its (`parity.step_parity`). `reference_step` is the course's one
single-process loop, `distlab.reference.train_reference`, for one step of plain SGD.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from distlab.models import MLP
from distlab.pipeline.executor import RankRun, pipeline_position, run_schedule
from distlab.pipeline.partition import balanced_boundaries, boundary_shapes, check_boundaries, parameter_costs
from distlab.pipeline.schedules import Schedule, make_schedule
from distlab.reference import SGD, mse_loss, train_reference


def split_microbatches(X: Tensor, y: Tensor, m: int) -> tuple[list[Tensor], list[Tensor]]:
    """Cut a batch into m equal, non-empty microbatches (equal, so that the mean of their mean losses is
    the mean loss of the batch, as GPipe requires; Huang et al. 2019, sec. 2.2)."""
    n = len(X)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m={m!r} microbatches: use a positive integer that divides the batch size {n}")
    if len(y) != n:
        raise ValueError(f"the batch has {n} inputs but {len(y)} targets; pass one target per input")
    if n < m:
        raise ValueError(f"batch size {n} is smaller than m={m} microbatches, so some would be empty; "
                         f"use a batch of at least {m} samples (a multiple of {m}) or a smaller m")
    if n % m:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        raise ValueError(f"batch size {n} is not divisible by m={m} microbatches; choose m from "
                         f"{divisors} or a batch size that is a multiple of {m}")
    return list(X.chunk(m)), list(y.chunk(m))


@dataclass(frozen=True)
class Outcome:
    """One whole training step: the mean loss of the batch, and every parameter's gradient and updated
    value, named as in the model's `named_parameters()`."""

    loss: float
    grads: dict[str, Tensor]
    params: dict[str, Tensor]


@dataclass
class StepResult:
    """One rank's step: its parameters' gradients and updated values (named as in the model's
    `named_parameters()`), and what the executor measured (the last stage's losses among it)."""

    grads: dict[str, Tensor]
    params: dict[str, Tensor]
    run: RankRun


def _stage_bounds(layers: Sequence[torch.nn.Module], num_stages: int,
                  boundaries: Sequence[int] | None) -> list[int]:
    if boundaries is None:
        return balanced_boundaries(parameter_costs(layers), num_stages)
    bounds = check_boundaries(boundaries, len(layers))
    if len(bounds) != num_stages + 1:
        raise ValueError(f"boundaries={bounds} give {len(bounds) - 1} stages but the schedule has "
                         f"p * v = {num_stages}; pass {num_stages + 1} boundaries")
    return bounds


def pipeline_step(sizes: Sequence[int], X: Tensor, y: Tensor, schedule: Schedule,
                  group: dist.ProcessGroup | None = None, seed: int = 0, lr: float = 0.1,
                  boundaries: Sequence[int] | None = None, device: torch.device | None = None) -> StepResult:
    """One SGD step of MLP(sizes) on (X, y), pipelined by `schedule` over the ranks of `group` (None: the
    whole world), as seen by this rank, with its stages on `device` (the CPU by default; its GPU on
    NCCL). Stages are cut by parameter count unless `boundaries` [0, b_1, ..., L] are given. Gradients
    and parameters come back on the CPU."""
    device = device or torch.device("cpu")
    rank = pipeline_position(schedule, group)
    if y.dim() != 2 or y.shape[1] != sizes[-1]:
        raise ValueError(f"targets of shape {tuple(y.shape)} do not match the MLP's output width "
                         f"sizes[-1]={sizes[-1]}; pass y of shape (batch, {sizes[-1]})")
    torch.manual_seed(seed)
    layers = MLP(sizes).layers
    S = schedule.num_stages
    bounds = _stage_bounds(layers, S, boundaries)
    xs, ys = split_microbatches(X, y, schedule.m)
    # the boundary shapes come from a forward of the whole MLP on the CPU, before this rank's stages move
    # to its device (`.to` moves the layers themselves, which that forward runs)
    shapes = dict(enumerate(boundary_shapes(layers, bounds, xs[0])))
    mine = {s: torch.nn.Sequential(*layers[bounds[s]:bounds[s + 1]]).to(device)
            for s in range(S) if schedule.rank_of(s) == rank}
    run = run_schedule(schedule, mine, xs, ys, F.mse_loss, shapes, group, device)
    grads, params = {}, {}
    with torch.no_grad():
        for s in mine:
            for i in range(bounds[s], bounds[s + 1]):
                for name, param in layers[i].named_parameters():
                    grads[f"{i}.{name}"] = param.grad.cpu().clone()
                    param -= lr * param.grad
                    params[f"{i}.{name}"] = param.detach().cpu().clone()
    return StepResult(grads, params, run)


def reference_step(sizes: Sequence[int], X: Tensor, y: Tensor, seed: int = 0, lr: float = 0.1) -> Outcome:
    """The same SGD step in one process on the whole batch: loss, gradients and updated parameters."""
    torch.manual_seed(seed)
    model = MLP(sizes)
    run = train_reference(model, [(X, y)], mse_loss, SGD(model.parameters(), lr))
    return Outcome(run.losses[0], run.first_grads, run.params)


def steps_on_rank(configs: Sequence[tuple[str, int, int]], sizes: Sequence[int], X: Tensor, y: Tensor,
                  seed: int = 0, lr: float = 0.1, group: dist.ProcessGroup | None = None) -> list[StepResult]:
    """Run several (schedule name, m, v) steps in one launch (starting ranks costs seconds): call on
    every rank, e.g. `launch.run(steps_on_rank, p, configs, sizes, X, y)`, with the pipeline's `group`
    (None: the whole world). On NCCL the stages run on this rank's GPU and the schedules are built with
    rendezvous_safe=True."""
    from distlab import launch

    p = dist.get_world_size(group)
    safe = dist.get_backend(group) == "nccl"
    return [pipeline_step(sizes, X, y, make_schedule(name, p, m, v, rendezvous_safe=safe), group, seed, lr,
                          device=launch.device())
            for name, m, v in configs]
