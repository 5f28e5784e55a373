"""ZeRO against plain data parallelism on one process: the same model, data, seed and Adam.

The tasks are the course's (`distlab.reference`), at the chapter's sizes (`zero_task`): the MLP of widths
(7, 13, 5), 174 parameters in units of 104 and 70, so that shards are uneven and padded on 3 and 4 ranks,
and a small GPT with tied embeddings and no biases. Every run draws its global batches of `GLOBAL_BATCH`
examples with `SEED`, as `Task.batch` does on every rank.

`train_zero` runs inside the ranks: it trains a task for a few steps with `zero.ZeRO` of some stage on
`group`, each rank on its contiguous slice of every global batch (the course's one step on a rank,
`Task.shard_backward`, its loss averaged by `reference.group_mean`), and returns the losses, the final
parameters, the bytes held and the bytes sent in the last step (counted by `distlab.comm_log` around the
step, without ZeRO's control messages). `train_reference` trains the same task on one process with
`torch.optim.Adam` on the whole batch (`distlab.reference.train_reference`).
`report`, `agree` and `verdict` state the result in `distlab.parity`'s words.

Tolerance. The averaged gradient is the same sum of the same fp32 terms as the single process's, added in
another order (per rank, then across ranks), so it differs by rounding, a few units of 2**-24 relative.
Adam's update (lr x m / (sqrt(v) + eps)) is scale-free, so a relative error in the gradient becomes about
the same relative error in the update, at most lr per step; after 4 steps at lr 1e-2 the parameters
agree to about 1e-7. fp32's tolerance in `distlab.parity.TOLERANCE`, 1e-5, is a hundred times that, and a
thousand times below what a real bug does (a gradient not averaged, a shard applied to the wrong rank,
padding that leaks into a parameter moves parameters by lr = 1e-2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distlab import parity, reference
from distlab.comm_log import comm_log
from distlab.memory.zero.accounting import measured_model_state_bytes, zero_sent_bytes
from distlab.memory.zero.engine import ZeRO
from distlab.reference import Task

# fp32's tolerance from the course's one table (distlab.parity), as torch.testing's atol/rtol: no second
# value, only the keywords lab 07's allclose cell passes (the tests use distlab.parity directly)
TOLERANCE = {"atol": parity.TOLERANCE[torch.float32], "rtol": parity.TOLERANCE[torch.float32]}
GLOBAL_BATCH = 24  # divisible by 1, 2, 3 and 4 ranks
LR = 1e-2
SEED = 0


def zero_task(name: str = "mlp", **sizes: Any) -> Task:
    """The chapter's task `name` ("mlp" or "gpt"), `distlab.reference`'s at the chapter's sizes; `sizes`
    overrides them (e.g. zero_task("gpt", n_layer=4, n_embd=64, block_size=16)).

    "mlp": regression with `models.MLP((7, 13, 5))` on 96 examples. "gpt": a GPT of 2 blocks, 2 heads,
    width 16, windows of 8 characters, tied embeddings and no biases: the bias of the attention keys has
    a gradient that is zero in exact arithmetic (softmax ignores a shift shared by all keys), so in fp32
    it is pure rounding noise, and Adam, which divides by the gradient's own size, turns noise into steps
    of up to lr. Such a parameter differs between any two summation orders by more than any tolerance,
    and says nothing about ZeRO."""
    if name == "mlp":
        return reference.mlp_task(**{"sizes": (7, 13, 5), "n": 96, "seed": SEED, **sizes})
    if name == "gpt":
        return reference.gpt_task(**{"n_layer": 2, "n_embd": 16, "block_size": 8, "n": 240, "seed": SEED,
                                     "n_head": 2, "bias": False, "sentences": 200, **sizes})
    raise ValueError(f"task={name!r} is not one of the chapter's tasks; choose 'mlp' or 'gpt'")


@dataclass
class RunResult:
    """What one run produced: the loss of each step (over the global batch), the final parameters, and
    (ZeRO runs) the per-rank bytes held after the last step and the bytes sent in the last step."""

    losses: list[float]
    params: dict[str, Tensor]
    memory: dict[str, int] = field(default_factory=dict)
    sent_bytes: dict[str, int] = field(default_factory=dict)
    padded_psi: int = 0


def train_zero(stage: int, task: str | Task = "mlp", steps: int = 4, group: dist.ProcessGroup | None = None,
               **zero_kwargs: Any) -> RunResult:
    """Inside the ranks: train `task` with ZeRO `stage` over `group` and report (see `RunResult`)."""
    t = zero_task(task) if isinstance(task, str) else task
    n, r = dist.get_world_size(group), dist.get_rank(group)
    model = t.build(SEED)
    engine = ZeRO(model, stage, group, lr=LR, **zero_kwargs)
    losses = []
    for step in range(steps):
        x, y = t.batch(step, GLOBAL_BATCH, SEED)
        engine.zero_grad()
        with comm_log() as log:  # the last step's log is the one reported
            loss = t.shard_backward(model, x, y, r, n)
            engine.step()
        losses.append(reference.group_mean(loss, group))  # not part of ZeRO's traffic: outside the log
    memory = measured_model_state_bytes(engine)  # after the step, before zero_grad: all states present
    sent = {op: zero_sent_bytes(log, op) for op in ("all_reduce", "reduce_scatter", "all_gather")}
    sent["total"] = zero_sent_bytes(log)
    params = engine.full_parameters()
    engine.remove()
    return RunResult(losses, params, memory, sent, engine.parameter_count(padded=True))


def train_reference(task: str | Task = "mlp", steps: int = 4) -> RunResult:
    """One process, the whole batch, `torch.optim.Adam`: what every ZeRO stage must reproduce."""
    t = zero_task(task) if isinstance(task, str) else task
    model = t.build(SEED)
    run = reference.train_reference(model, t.batches(steps, GLOBAL_BATCH, SEED), t.loss,
                                    torch.optim.Adam(model.parameters(), lr=LR))
    return RunResult(run.losses, run.params)


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
