"""One training step of the course's GPT with data, pipeline and tensor parallelism on one DeviceMesh.

Every rank runs the same code (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", SC'21, sec. 2-3), with the three groups of `distlab.mesh.grid(dp=,
pp=, tp=)`:

1. build: the dense GPT from `seed` (identical on every rank), cut to this rank's pipeline stage and
   tensor-parallel shard (`model.build_stage`); chapter 7's `ZeRO(stage_model, zero_stage,
   group=dp_group)` becomes the optimizer (Adam), with `hook_gradients=False` because the pipeline's m
   backward passes accumulate into `.grad` first;
2. per step: this replica's batch / dp sequences, cut into m micro-batches, run by chapter 4's
   `run_schedule` (GPipe or 1F1B, `group=` the pp group) on stage modules whose layers are chapter 5's
   (`group=` the tp group), the last stage's loss being `vocab_parallel_cross_entropy`;
3. after the flush: the tied embedding's two partial gradients summed between the first and the last
   stage (chapter 4), sequence parallelism's replicated gradients summed over tp (chapter 5), then ZeRO
   averages over dp and takes Adam's step (chapter 7).

`Trainer3D` holds one rank's state and does one step at a time, so a run can stop after step k, be
saved (`checkpoint.save`: it is `Checkpointable`), and go on from a checkpoint on another (dp, pp, tp);
`train_3d` is its loop over a list of batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from distlab.comm_log import CommLog, comm_log
from distlab.memory.zero import ZeRO
from distlab.mesh import flat_group, group_rank
from distlab.models import GPT, GPTConfig
from distlab.parallel3d.checkpoint import ShardedParam
from distlab.parallel3d.checkpoint.zero_state import load_zero_state, zero_state
from distlab.parallel3d.config import Plan3D, check_plan
from distlab.parallel3d.cost_model import Traffic
from distlab.parallel3d.model import build_stage, named_shards
from distlab.parallel3d.traffic import TIED_GRAD, step_traffic
from distlab.pipeline import make_schedule
from distlab.pipeline.executor import run_schedule
from distlab.pipeline.gpt import tie_embedding_gradients
from distlab.pipeline.train import split_microbatches
from distlab.sharding import shard
from distlab.tensor_parallel import vocab_parallel_cross_entropy


@dataclass
class RankRun3D:
    """What one rank returns: its coordinates, the loss of each step (last pipeline stage; None
    elsewhere), the dp-averaged gradients of the first step and the parameters after the last, by dense
    name, and the traffic of the last step."""

    coords: dict[str, int]
    losses: list[float] | None
    first_grads: dict[str, Tensor]
    params: dict[str, Tensor]
    traffic: Traffic


def make_batches(config: GPTConfig, batch: int, seq: int, steps: int,
                 seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    """`steps` batches of random token ids (idx, targets), each (batch, seq), from `seed`."""
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=gen)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


def dense_gpt(config: GPTConfig, seed: int, dtype: torch.dtype) -> GPT:
    """The one dense GPT every rank (and the reference) starts from."""
    torch.manual_seed(seed)
    return GPT(config).to(dtype)


class Trainer3D:
    """One rank's part of a 3D-parallel run, a step at a time: what `train_3d` loops over, and what a
    checkpoint saves and loads (`checkpoint.Checkpointable`: `step`, `params()`, `optimizer_state()`,
    `load_optimizer_state()`). `batch` and `seq` are the global batch's shape. Call it on every rank."""

    def __init__(self, mesh: DeviceMesh, config: GPTConfig, plan: Plan3D, batch: int, seq: int,
                 seed: int = 0, lr: float = 1e-2, dtype: torch.dtype = torch.float64,
                 device: torch.device | None = None) -> None:
        check_plan(plan, config, batch, seq, dist.get_world_size())
        self.plan, self.batch, self.dtype, self.mesh = plan, batch, dtype, mesh
        self.groups = {d: mesh[d].get_group() for d in ("dp", "pp", "tp")}
        self.coords = {d: group_rank(g) for d, g in self.groups.items()}
        self.mesh_group = flat_group(mesh)  # every rank of the mesh: where the step's loss is reported
        self.device = device or torch.device("cpu")
        self.log: CommLog = comm_log(mesh=mesh)  # the calls of the last step
        self.model = build_stage(dense_gpt(config, seed, dtype).to(self.device), self.coords["pp"], plan.pp,
                                 self.groups["tp"], plan.sequence_parallel)
        self.zero = ZeRO(self.model, plan.zero_stage, self.groups["dp"], lr=lr,
                         units=list(self.model.h.values()), hook_gradients=False)
        nccl = dist.get_backend(self.groups["pp"]) == "nccl"
        self.schedule = make_schedule(plan.schedule, plan.pp, plan.m, rendezvous_safe=nccl)
        shape = torch.Size((batch // (plan.dp * plan.m), seq // plan.tp if plan.sequence_parallel else seq,
                            config.n_embd))
        self.shapes = {s: shape for s in range(1, plan.pp)}
        self.module = nn.Sequential(*self.model.layers)
        self.step = 0
        self.last_run = None  # the executor's `RankRun` of the last step (its peak stash: a dry run reads it)
        self.first_grads: dict[str, Tensor] = {}

    def _loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return vocab_parallel_cross_entropy(logits, targets, self.groups["tp"])

    def train_step(self, idx: Tensor, targets: Tensor, keep_grads: bool = False) -> float | None:
        """One optimizer step on the global batch (idx, targets); this replica's loss on the last pipeline
        stage, None elsewhere. `keep_grads`: keep the dp-averaged gradients in `first_grads` (parity)."""
        plan, model, stage = self.plan, self.model, self.coords["pp"]
        self.log = log = comm_log(mesh=self.mesh)
        rows = shard(self.batch, self.coords["dp"], plan.dp)
        xs, ys = split_microbatches(idx[rows], targets[rows], plan.m)
        with log:
            run = self.last_run = run_schedule(self.schedule, {stage: self.module}, xs, ys, self._loss,
                                               self.shapes, self.groups["pp"], self.device, self.dtype)
            if plan.pp > 1 and (model.is_first or model.is_last):  # the stages in between hold no copy
                with log.where(TIED_GRAD):
                    tie_embedding_gradients(model.wte.weight, self.schedule, self.groups["pp"], stage)
            model.sequence_parallel_grads()
        if keep_grads:  # for the parity check only: not part of the step, not recorded
            self.first_grads = _averaged_grads(model, self.groups["dp"], plan.dp)
        with log:
            self.zero.take_gradients()
            self.zero.step()
        self.zero.zero_grad()
        self.step += 1
        return sum(run.losses.values()) / plan.m if model.is_last else None

    def traffic(self) -> Traffic:
        """What this rank sent in the last step, per (axis, kind), read from the step's log."""
        return step_traffic(self.log, self.schedule, self.coords["pp"])

    def global_loss(self, loss: float | None) -> float:
        """The step's loss over the whole batch, on every rank: the mean of the dp replicas' last-stage
        losses (one all-reduce over the group of every rank of the mesh; tp rank 0 of each last stage
        contributes)."""
        mine = loss is not None and self.coords["tp"] == 0
        t = torch.tensor([loss / self.plan.dp if mine else 0.0], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.mesh_group)
        return t.item()

    def params(self) -> list[ShardedParam]:
        """The checkpoint contract: this rank's parameters by dense name (`model.named_shards`)."""
        return named_shards(self.model)

    def optimizer_state(self) -> dict[str, list[ShardedParam]]:
        """Adam's state per parameter, gathered over dp from ZeRO's flat shards (`checkpoint.zero_state`)."""
        return zero_state(self.zero, self.model, self.params())

    def load_optimizer_state(self, state: dict[str, dict[str, Tensor]], steps: int) -> None:
        """Per-parameter Adam state (this rank's tp shards, by dense name) back into ZeRO's dp shards."""
        load_zero_state(self.zero, self.model, state, steps)

    def state(self) -> dict[str, Tensor]:
        """This rank's parameters by dense name, copied to the CPU."""
        return {n: p.detach().cpu().clone() for n, p in self.model.named_parameters()}

    def close(self) -> None:
        """Take ZeRO's hooks off the model."""
        self.zero.remove()


def train_3d(mesh: DeviceMesh, config: GPTConfig, plan: Plan3D, batches: list[tuple[Tensor, Tensor]],
             seed: int = 0, lr: float = 1e-2, dtype: torch.dtype = torch.float64,
             device: torch.device | None = None) -> RankRun3D:
    """Train GPT(config) for len(batches) steps with `plan` on `mesh` (dims dp, pp, tp); return this
    rank's `RankRun3D`. Call it on every rank of the mesh."""
    batch, seq = batches[0][0].shape
    trainer = Trainer3D(mesh, config, plan, batch, seq, seed, lr, dtype, device)
    losses = [trainer.train_step(idx, targets, keep_grads=step == 0) for step, (idx, targets) in
              enumerate(batches)]
    params = trainer.state()
    trainer.close()
    return RankRun3D(trainer.coords, losses if trainer.model.is_last else None, trainer.first_grads, params,
                     trainer.traffic())


def _averaged_grads(model: nn.Module, dp_group: dist.ProcessGroup, dp: int) -> dict[str, Tensor]:
    out = {}
    for n, p in model.named_parameters():
        g = p.grad.detach().clone()
        dist.all_reduce(g, group=dp_group)
        out[n] = (g / dp).cpu()
    return out

