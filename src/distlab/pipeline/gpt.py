"""A pipelined GPT: the blocks of `distlab.models.GPT` as stages, with its tied embedding kept in step.

A GPT is not a plain list of layers. `gpt_layers` makes it one: an `Embedding` stage input layer (token
and position embeddings), the `Block`s, and a `Head` (final LayerNorm and the output layer). The output
layer's weight *is* the token embedding (weight tying, Press & Wolf 2017), so with p > 1 the first and
the last stage hold two copies of one matrix, on two ranks. Each copy receives only part of the gradient
(the embedding's on the first rank, the output layer's on the last), so after the schedule the two
ranks add up that gradient and then take the same optimizer step, as Megatron-LM does with its
embedding group (Shoeybi et al. 2019; Narayanan et al. 2021). Here the two swap their parts with a send
and a receive in the pipeline's group, which needs no group of their own.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distlab import reference
from distlab.models import GPT, GPTConfig
from distlab.pipeline.executor import pipeline_position, run_schedule
from distlab.pipeline.p2p import PointToPoint
from distlab.pipeline.partition import balanced_boundaries, boundary_shapes, parameter_costs
from distlab.pipeline.schedules import Schedule
from distlab.pipeline.train import Outcome, StepResult, split_microbatches


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


def tie_embedding_gradients(weight: nn.Parameter, schedule: Schedule, group: dist.ProcessGroup | None,
                             rank: int) -> None:
    """Add the tied matrix's two partial gradients on the first and the last stage's rank, so that both
    copies take the same step (Megatron-LM's embedding group; Narayanan et al. 2021).

    The two ranks swap their parts with one send and one receive in the pipeline's own `group` (no group
    is created: `dist.new_group` is collective over the whole world), and both add them in the same order
    (first stage's part + last stage's part), so the two sums are bitwise equal. Other ranks do nothing.
    """
    first, last = schedule.rank_of(0), schedule.rank_of(schedule.num_stages - 1)
    if first == last or rank not in (first, last):
        return
    other = PointToPoint(group).exchange(weight.grad, last if rank == first else first,
                                         tag=2 * schedule.num_stages * schedule.m)
    parts = (weight.grad, other) if rank == first else (other, weight.grad)
    weight.grad.copy_(parts[0] + parts[1])


def gpt_pipeline_step(config: GPTConfig, idx: Tensor, targets: Tensor, schedule: Schedule,
                      group: dist.ProcessGroup | None = None, seed: int = 0, lr: float = 0.1,
                      device: torch.device | None = None) -> StepResult:
    """One SGD step of GPT(config) on (idx, targets), pipelined by `schedule` over the ranks of `group`
    (None: the whole world), as seen by this rank, with its stages on `device` (default: the CPU).
    Gradients and parameters, returned on the CPU, are named as in `GPT.named_parameters()` (the tied
    matrix as wte.weight)."""
    if config.dropout:
        raise ValueError(f"config.dropout={config.dropout}: the pipeline draws dropout masks microbatch by "
                         "microbatch, in another order than one process, so the step cannot equal the "
                         "reference; use dropout=0.0 to check parity")
    device = device or torch.device("cpu")
    rank = pipeline_position(schedule, group)
    torch.manual_seed(seed)
    gpt = GPT(config)
    layers = gpt_layers(gpt)
    S = schedule.num_stages
    bounds = balanced_boundaries(parameter_costs(layers), S)
    xs, ys = split_microbatches(idx, targets, schedule.m)
    shapes = dict(enumerate(boundary_shapes(layers, bounds, xs[0])))  # on the CPU, before any `.to(device)`
    mine = {s: nn.Sequential(*layers[bounds[s]:bounds[s + 1]]).to(device)
            for s in range(S) if schedule.rank_of(s) == rank}
    run = run_schedule(schedule, mine, xs, ys, lm_loss, shapes, group, device)
    tie_embedding_gradients(gpt.wte.weight, schedule, group, rank)
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
                       lr: float = 0.1) -> Outcome:
    """The same SGD step of the GPT in one process on the whole batch: loss, gradients, updated weights."""
    torch.manual_seed(seed)
    gpt = GPT(config)
    optimizer = reference.SGD(gpt.parameters(), lr)
    run = reference.train_reference(gpt, [(idx, targets)], reference.lm_loss, optimizer)
    return Outcome(run.losses[0], run.first_grads, run.params)
