"""ZeRO against plain data parallelism on one process: the same model, data, seed and Adam.

`train_zero` runs inside the ranks: it trains a task for a few steps with `zero.ZeRO` of some stage on
`group`, each rank on its contiguous slice of every global batch (`distlab.sharding`), and returns the
losses, the final parameters, the bytes held and the collectives called. `train_reference` trains the
same task on one process with `torch.optim.Adam` on the whole batch. `report`, `agree` and `verdict`
state the result in `distlab.parity`'s words.

Tolerance. The averaged gradient is the same sum of the same fp32 terms as the single process's, added in
another order (per rank, then across ranks), so it differs by rounding, a few units of 2**-24 relative.
Adam's update (lr x m / (sqrt(v) + eps)) is scale-free, so a relative error in the gradient becomes about
the same relative error in the update, at most lr per step; after 4 steps at lr 1e-2 the parameters
agree to about 1e-7. `TOLERANCE` allows 1e-5 absolute (plus 1e-5 relative): a hundred times that, and a
thousand times below what a real bug does (a gradient not averaged, a shard applied to the wrong rank,
padding that leaks into a parameter moves parameters by lr = 1e-2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distlab import models, parity, sharding
from distlab.memory.zero.accounting import measured_model_state_bytes
from distlab.memory.zero.engine import ZeRO

# fp32 rounding, from the course's one table (distlab.parity), as torch.testing's atol/rtol
TOLERANCE = {"atol": parity.TOLERANCE[torch.float32], "rtol": parity.TOLERANCE[torch.float32]}
GLOBAL_BATCH = 24  # divisible by 1, 2, 3 and 4 ranks
LR = 1e-2


@dataclass
class Task:
    """A model and its data: `build()` makes the model from a fixed seed; `batch(step)` is the global
    batch of a step; `loss(model, x, y)` the mean loss over a batch."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int], tuple[Tensor, Tensor]]
    loss: Callable[[nn.Module, Tensor, Tensor], Tensor]


def mlp_task(sizes: tuple[int, ...] = (7, 13, 5), n: int = 96, seed: int = 0) -> Task:
    """Regression with an MLP of widths `sizes`. The default has 174 parameters in units of 104 and 70:
    not divisible by 3 or 4, so shards are uneven and padded."""
    x_all, y_all = models.regression_data(n, sizes[0], sizes[-1], seed=seed)

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return models.MLP(list(sizes))

    def batch(step: int) -> tuple[Tensor, Tensor]:
        idx = sharding.batch_indices(n, GLOBAL_BATCH, step, seed)
        return x_all[idx], y_all[idx]

    return Task("mlp", build, batch, lambda m, x, y: F.mse_loss(m(x), y))


def gpt_task(n_layer: int = 2, n_embd: int = 16, block_size: int = 8, seed: int = 0) -> Task:
    """A small GPT (tied embeddings, two blocks) on the course's arithmetic text, without biases: the
    bias of the attention keys has a gradient that is zero in exact arithmetic (softmax ignores a shift
    shared by all keys), so in fp32 it is pure rounding noise, and Adam, which divides by the gradient's
    own size, turns noise into steps of up to lr. Such a parameter differs between any two summation
    orders by more than any tolerance, and says nothing about ZeRO."""
    text = models.char_corpus(200, seed=seed)
    tok = models.CharTokenizer(text)
    data = tok.encode(text)
    config = models.GPTConfig(vocab_size=tok.vocab_size, block_size=block_size, n_layer=n_layer,
                              n_head=2, n_embd=n_embd, bias=False)

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return models.GPT(config)

    def batch(step: int) -> tuple[Tensor, Tensor]:
        return models.get_batch(data, block_size, GLOBAL_BATCH, torch.Generator().manual_seed(seed + step))

    return Task("gpt", build, batch, lambda m, x, y: m(x, y)[1])


TASKS = {"mlp": mlp_task, "gpt": gpt_task}


@dataclass
class RunResult:
    """What one run produced: the loss of each step (over the global batch), the final parameters, and
    (ZeRO runs) the per-rank bytes held after the last step and the bytes sent in the last step."""

    losses: list[float]
    params: dict[str, Tensor]
    memory: dict[str, int] = field(default_factory=dict)
    sent_bytes: dict[str, int] = field(default_factory=dict)
    padded_psi: int = 0


def group_mean(value: Tensor, group: dist.ProcessGroup | None) -> float:
    """The mean of a scalar over the group (for reporting the global loss; not part of ZeRO's traffic)."""
    t = value.detach().clone().reshape(1)
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


def train_zero(stage: int, task: str | Task = "mlp", steps: int = 4, group: dist.ProcessGroup | None = None,
               **zero_kwargs: Any) -> RunResult:
    """Inside the ranks: train `task` with ZeRO `stage` over `group` and report (see `RunResult`)."""
    t = TASKS[task]() if isinstance(task, str) else task
    n, r = dist.get_world_size(group), dist.get_rank(group)
    model = t.build()
    engine = ZeRO(model, stage, group, lr=LR, **zero_kwargs)
    losses = []
    for step in range(steps):
        x, y = t.batch(step)
        mine = sharding.shard(len(x), r, n)
        engine.zero_grad()
        engine.log.clear()
        loss = t.loss(model, x[mine], y[mine])
        loss.backward()
        engine.step()
        losses.append(group_mean(loss, group))
    memory = measured_model_state_bytes(engine)  # after the step, before zero_grad: all states present
    sent = {op: engine.log.sent_bytes(op) for op in ("all_reduce", "reduce_scatter", "all_gather")}
    sent["total"] = engine.log.sent_bytes()
    params = engine.full_parameters()
    engine.remove()
    return RunResult(losses, params, memory, sent, engine.parameter_count(padded=True))


def train_reference(task: str | Task = "mlp", steps: int = 4) -> RunResult:
    """One process, the whole batch, `torch.optim.Adam`: what every ZeRO stage must reproduce."""
    t = TASKS[task]() if isinstance(task, str) else task
    model = t.build()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = t.loss(model, *t.batch(step))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return RunResult(losses, {name: p.detach().clone() for name, p in model.named_parameters()})


def report(a: RunResult, b: RunResult, what: str = "") -> parity.ParityReport:
    """The losses and every parameter of `a` against `b` (`distlab.parity.compare`, fp32's tolerance)."""
    return parity.compare({"losses": a.losses, "parameters": a.params},
                          {"losses": b.losses, "parameters": b.params}, dtype=torch.float32, label=what)


def agree(a: RunResult, b: RunResult) -> bool:
    """True when the losses and every parameter of `a` and `b` agree within fp32's tolerance."""
    return a.params.keys() == b.params.keys() and report(a, b).passed


def verdict(a: RunResult, b: RunResult, what: str) -> str:
    """One line for a lab, the same on every machine: "<what>: all 4 losses and all 4 parameters agree
    within 1e-05: ok"."""
    return report(a, b, what).verdict()
