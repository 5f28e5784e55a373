"""Distributed Muon against one process: `torch.optim.Muon` for the matrices, `torch.optim.AdamW` for the
rest, on the same model, data and seed.

`muon_task` is the course's MLP with five linear layers of five shapes (7 -> 13 -> 11 -> 9 -> 6 -> 5),
so five matrices of uneven Newton-Schulz work and five biases for AdamW; `muon_task("gpt")` the course's
small GPT (embeddings to AdamW, its eight linear weights to Muon). `train_muon` runs inside the ranks,
each rank on its rows of every global batch (`Task.shard_backward`), and returns the losses, the final
parameters, the optimizer state bytes and the communication log of the last step; `train_reference`
trains on one process on the whole batch.

Tolerance: float64, `distlab.parity.TOLERANCE[torch.float64]` = 1e-10. The averaged gradient is the same
sum as one process's in another order, so it differs from it by about 1e-16 relative. Muon casts it to
bfloat16 before Newton-Schulz (as torch.optim.Muon does); a difference of 1e-16 flips a bf16 rounding only
when an element lies within 1e-16 of a rounding boundary, so the bf16 inputs, and hence the whole
orthogonalised update, are the same bits, and the parameters differ by float64 rounding only. In float32
the same flip happens now and then and moves a parameter by lr x 2^-8: a bf16 update is not a test of
float32 rounding, which is why the test runs in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distlab import parity, reference
from distlab.comm_log import CommRecord, comm_log
from distlab.memory.muon.all_to_all import AllToAllMuon
from distlab.memory.muon.newton_schulz import MuonSettings
from distlab.memory.muon.owner import OwnerMuon
from distlab.memory.muon.split import split_parameters
from distlab.reference import Task

GLOBAL_BATCH = 24  # divisible by 1, 2, 3 and 4 ranks
SEED = 0
SETTINGS = MuonSettings(lr=0.02, weight_decay=0.1, adamw_lr=1e-2, adamw_weight_decay=0.01)
LAYOUTS = {"owner": OwnerMuon, "all_to_all": AllToAllMuon}


def muon_task(name: str = "mlp") -> Task:
    """The chapter's Muon task: "mlp" (five matrices of five shapes) or "gpt" (a 1-block GPT, width 16)."""
    if name == "mlp":
        return reference.mlp_task(sizes=(7, 13, 11, 9, 6, 5), n=96, seed=SEED)
    if name == "gpt":
        return reference.gpt_task(n_layer=1, n_embd=16, block_size=8, n=96, seed=SEED, n_head=2,
                                  bias=False, sentences=60)
    raise ValueError(f"task={name!r} is not one of the Muon tasks; choose 'mlp' or 'gpt'")


def _as_double(x: Tensor) -> Tensor:
    return x.double() if x.is_floating_point() else x


@dataclass
class MuonRun:
    """Losses per step, final parameters, this rank's optimizer-state bytes and its last step's log."""

    losses: list[float]
    params: dict[str, Tensor]
    state_bytes: int = 0
    records: list[CommRecord] = field(default_factory=list)


def train_muon(layout: str, task: str = "mlp", steps: int = 10, group: dist.ProcessGroup | None = None,
               settings: MuonSettings = SETTINGS) -> MuonRun:
    """Inside the ranks: train `task` in float64 with distributed Muon `layout` ("owner" or "all_to_all")."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not a distributed Muon layout; choose one of "
                         f"{sorted(LAYOUTS)}")
    t = muon_task(task)
    n, r = dist.get_world_size(group), dist.get_rank(group)
    model = t.build(SEED).double()
    opt = LAYOUTS[layout](*split_parameters(model), settings, group=group)
    losses = []
    for step in range(steps):
        x, y = (_as_double(v) for v in t.batch(step, GLOBAL_BATCH, SEED))
        with comm_log() as log:  # the last step's log is the one returned
            loss = t.shard_backward(model, x, y, r, n)
            opt.step()
        opt.zero_grad()
        losses.append(reference.group_mean(loss, group))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return MuonRun(losses, params, opt.state_bytes(), list(log.records))


class _MuonAndAdamW:
    """torch.optim.Muon and torch.optim.AdamW stepped together: the single-process reference."""

    def __init__(self, model: torch.nn.Module, settings: MuonSettings) -> None:
        muon, adamw = split_parameters(model)
        self.optims: list[Any] = [torch.optim.Muon([p for _, p in muon], **settings.muon_kwargs())]
        if adamw:
            self.optims.append(torch.optim.AdamW([p for _, p in adamw], **settings.adamw_kwargs()))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optims:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optims:
            o.step()


def train_reference(task: str = "mlp", steps: int = 10, settings: MuonSettings = SETTINGS) -> MuonRun:
    """One process, the whole batch, torch.optim.Muon + torch.optim.AdamW, float64."""
    t = muon_task(task)
    model = t.build(SEED).double()
    batches = [tuple(_as_double(v) for v in b) for b in t.batches(steps, GLOBAL_BATCH, SEED)]
    run = reference.train_reference(model, batches, t.loss, _MuonAndAdamW(model, settings))
    return MuonRun(run.losses, run.params)


def report(ours: MuonRun, ref: MuonRun, what: str = "") -> parity.ParityReport:
    """Losses and every parameter, float64's tolerance (see the module docstring)."""
    return parity.compare({"losses": ours.losses, "parameters": ours.params},
                          {"losses": ref.losses, "parameters": ref.params}, dtype=torch.float64,
                          label=what, against="torch.optim.Muon + AdamW on one process")
