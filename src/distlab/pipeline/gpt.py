"""A pipelined GPT: the blocks of `distlab.models.GPT` as stages, with its tied embedding kept in step.

A GPT is not a plain list of layers. `gpt_layers` makes it one: an `Embedding` stage input layer (token
and position embeddings), the `Block`s, and a `Head` (final LayerNorm and the output layer). The output
layer's weight *is* the token embedding (weight tying, Press & Wolf 2017), so with p > 1 the first and
the last stage hold two copies of one matrix, on two ranks. Each copy receives only part of the gradient
(the embedding's on the first rank, the output layer's on the last), so after the schedule the two
ranks all-reduce that gradient and then take the same optimizer step, as Megatron-LM does with its
embedding group (Shoeybi et al. 2019; Narayanan et al. 2021).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distlab.models import GPT, GPTConfig
from distlab.pipeline.executor import run_schedule
from distlab.pipeline.partition import balanced_boundaries, boundary_shapes, parameter_costs
from distlab.pipeline.schedules import Schedule
from distlab.pipeline.train import StepResult, split_microbatches


class Embedding(nn.Module):
    """Token plus learned position embedding of a GPT (its first layer in a pipeline)."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop

    def forward(self, idx: Tensor) -> Tensor:
        return self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))


class Head(nn.Module):
    """Final LayerNorm and the (tied) output layer of a GPT: activations to logits."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head

    def forward(self, x: Tensor) -> Tensor:
        return self.lm_head(self.ln_f(x))


def gpt_layers(gpt: GPT) -> list[nn.Module]:
    """The GPT as a list a pipeline can cut: [Embedding, Block, ..., Block, Head]."""
    return [Embedding(gpt), *gpt.h, Head(gpt)]


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy of logits (B, T, V) against targets (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def gpt_pipeline_step(config: GPTConfig, idx: Tensor, targets: Tensor, schedule: Schedule, rank: int,
                      seed: int = 0, lr: float = 0.1, device: torch.device | None = None) -> StepResult:
    """One SGD step of GPT(config) on (idx, targets), pipelined by `schedule`, as seen by rank `rank`,
    with this rank's stages on `device` (default: the CPU). Gradients and parameters, returned on the
    CPU, are named as in `GPT.named_parameters()` (the tied matrix as wte.weight)."""
    device = device or torch.device("cpu")
    torch.manual_seed(seed)
    gpt = GPT(config)
    layers = gpt_layers(gpt)
    S, p = schedule.num_stages, schedule.p
    bounds = balanced_boundaries(parameter_costs(layers), S)
    xs, ys = split_microbatches(idx, targets, schedule.m)
    mine = {s: nn.Sequential(*layers[bounds[s]:bounds[s + 1]]) for s in range(S) if s % p == rank}
    shapes = dict(enumerate(boundary_shapes(layers, bounds, xs[0])))
    for module in mine.values():
        module.to(device)
    run = run_schedule(schedule, mine, xs, ys, lm_loss, shapes, rank, device)
    tied = gpt.wte.weight
    first, last = 0, (S - 1) % p
    if first != last:  # every rank must take part in creating the group, even those outside it
        group = dist.new_group([first, last])
        if rank in (first, last):
            dist.all_reduce(tied.grad, group=group)
    names = {id(param): name for name, param in gpt.named_parameters()}
    grads, params = {}, {}
    with torch.no_grad():
        own = {id(q): q for module in mine.values() for q in module.parameters()}
        for key, param in own.items():
            grads[names[key]] = param.grad.cpu().clone()
            param -= lr * param.grad
            params[names[key]] = param.detach().cpu().clone()
    return StepResult(grads, params, run)


def gpt_reference_step(config: GPTConfig, idx: Tensor, targets: Tensor, seed: int = 0,
                       lr: float = 0.1) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The same SGD step of the GPT in one process on the whole batch: (gradients, updated parameters)."""
    torch.manual_seed(seed)
    gpt = GPT(config)
    gpt(idx, targets)[1].backward()
    grads = {n: q.grad.clone() for n, q in gpt.named_parameters()}
    with torch.no_grad():
        for q in gpt.parameters():
            q -= lr * q.grad
    return grads, {n: q.detach().clone() for n, q in gpt.named_parameters()}
