"""A minimal (dp, tp) trainer to checkpoint: chapter 5's `ParallelGPT` over tp, chapter 7's `ZeRO` over dp.

It is the lab's small example of a checkpointable trainer, against the same contract as the 3D step
(`train.Trainer3D`): `checkpoint.ShardedParam`, for every local parameter its dense GPT name, its local
tensor and how it is split over tp (`contract.tp_split`), and Adam's state per parameter. The optimizer is
chapter 7's ZeRO in one of its two forms (`TrainConfig.optimizer`): the engine with its own Adam
(`"engine"`, state through `checkpoint.zero_state`), or `ShardedOptimizer` around `torch.optim.Adam`
(`"sharded"`, state through its state dicts, `checkpoint.sharded_state`). The data are random tokens
cut by `distlab.sharding` (the global batch of step t is a function of the seed and t alone), so "where
in the data are we" is the step number and nothing else has to be saved for it. A rank's step is the
course's one (`reference.Task.shard_backward` on `checkpoint_task`, the loss averaged over dp by
`reference.group_mean`), and the reference the course's one loop (`reference.train_reference`).

Every mesh trains the same dense model on the same global batch: the dp ranks average their gradients
(ZeRO's reduce-scatter), the tp ranks hold slices of each matrix (Shoeybi et al. 2019, sec. 3). So the
losses of any (dp, tp) equal those of one process with `torch.optim.Adam` up to float64 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh

from distlab.memory.zero import ShardedOptimizer, ZeRO
from distlab.models import GPT, GPTConfig
from distlab.parallel3d.checkpoint.contract import ShardedParam, tp_split
from distlab.parallel3d.checkpoint.sharded_state import load_sharded_optimizer_state, sharded_optimizer_state
from distlab.parallel3d.checkpoint.zero_state import load_zero_state, zero_state
from distlab.reference import Task, count_tokens, group_mean, lm_loss, train_reference
from distlab.sharding import batch_indices
from distlab.tensor_parallel.model import ParallelGPT

OPTIMIZERS = ("engine", "sharded")


@dataclass(frozen=True)
class TrainConfig:
    """The model, data and optimizer of the checkpointing runs (tiny, float64: parity is exact)."""

    vocab_size: int = 16
    block_size: int = 8
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 8
    n_items: int = 48
    batch_size: int = 12
    lr: float = 1e-2
    zero_stage: int = 2
    seed: int = 0
    optimizer: str = "engine"  # chapter 7's ZeRO engine, or "sharded": ShardedOptimizer(torch.optim.Adam)

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is unknown; choose 'engine' (chapter 7's ZeRO "
                             "with its own Adam) or 'sharded' (ShardedOptimizer around torch.optim.Adam)")

    def gpt(self) -> GPTConfig:
        return GPTConfig(vocab_size=self.vocab_size, block_size=self.block_size, n_layer=self.n_layer,
                         n_head=self.n_head, n_embd=self.n_embd)


def dataset(cfg: TrainConfig) -> Tensor:
    """`n_items` random sequences of block_size + 1 tokens (inputs and next-token targets)."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randint(cfg.vocab_size, (cfg.n_items, cfg.block_size + 1), generator=g)


def global_batch(cfg: TrainConfig, data: Tensor, step: int) -> tuple[Tensor, Tensor]:
    """The inputs and targets of step `step` (the same on every rank and every mesh)."""
    rows = data[batch_indices(cfg.n_items, cfg.batch_size, step, cfg.seed)]
    return rows[:, :-1], rows[:, 1:]


def dense_model(cfg: TrainConfig) -> GPT:
    """The dense float64 GPT every run starts from (seeded, so every rank builds the same one)."""
    torch.manual_seed(cfg.seed)
    return GPT(cfg.gpt()).double()


def checkpoint_task(cfg: TrainConfig) -> Task:
    """The runs' model and data as the course's `reference.Task`: `dense_model`, the sequences of
    `dataset` cut into inputs and next-token targets, the mean cross-entropy (`task.batch(t,
    cfg.batch_size, cfg.seed)` is `global_batch(cfg, dataset(cfg), t)`)."""
    data = dataset(cfg)
    return Task("checkpointed GPT", lambda: dense_model(cfg), data[:, :-1], data[:, 1:], lm_loss,
                count_tokens)


class Trainer:
    """The model and ZeRO optimizer of one rank on a mesh with dims "dp" and "tp" (either may be 1).

    `step` counts the optimizer steps done; `train_step()` does one and returns the global mean loss.
    """

    def __init__(self, cfg: TrainConfig, mesh: DeviceMesh, device: torch.device | None = None) -> None:
        if torch.get_default_dtype() != torch.float64:
            raise ValueError(f"default dtype {torch.get_default_dtype()} must be torch.float64 for the "
                             "exact parity these runs claim; call torch.set_default_dtype(torch.float64)")
        self.cfg, self.mesh = cfg, mesh
        self.dp_group, self.tp_group = mesh["dp"].get_group(), mesh["tp"].get_group()
        self.dp, self.dp_rank = dist.get_world_size(self.dp_group), dist.get_rank(self.dp_group)
        device = device or torch.device("cpu")  # on NCCL: this rank's GPU (launch.device())
        self.model = ParallelGPT.from_dense(dense_model(cfg).to(device), group=self.tp_group)
        self.zero: ZeRO | None = None
        self.opt: ShardedOptimizer | None = None
        if cfg.optimizer == "sharded":
            self.opt = ShardedOptimizer(self.model.named_parameters(), torch.optim.Adam, group=self.dp_group,
                                        stage=cfg.zero_stage, lr=cfg.lr)
        else:
            self.zero = ZeRO(self.model, cfg.zero_stage, group=self.dp_group, lr=cfg.lr)
        self.data = dataset(cfg).to(device)
        self.task = checkpoint_task(cfg)
        self.step = 0

    def train_step(self) -> float:
        """One step on this rank's slice of the global batch; the loss averaged over dp."""
        x, y = global_batch(self.cfg, self.data, self.step)
        loss = self.task.shard_backward(self.model, x, y, self.dp_rank, self.dp)
        optimizer = self.opt or self.zero
        optimizer.step()
        optimizer.zero_grad()
        self.step += 1
        return group_mean(loss, self.dp_group)

    def params(self) -> list[ShardedParam]:
        """The contract: every local parameter with its dense name and its tp split."""
        return [ShardedParam(name, p.data, *tp_split(name)) for name, p in self.model.named_parameters()]

    def optimizer_state(self) -> dict[str, list[ShardedParam]]:
        """Adam's exp_avg and exp_avg_sq per parameter, whole over dp (from the engine's flat shards, or
        the sharded optimizer's state dict)."""
        if self.opt is not None:
            return sharded_optimizer_state(self.opt, self.model, self.params())
        return zero_state(self.zero, self.model, self.params())

    def load_optimizer_state(self, state: dict[str, dict[str, Tensor]], steps: int) -> None:
        """Put per-parameter state (local tp shards, by dense name) back into this dp size's shards."""
        if self.opt is not None:
            load_sharded_optimizer_state(self.opt, self.model, state, steps)
        else:
            load_zero_state(self.zero, self.model, state, steps)


def reference_losses(cfg: TrainConfig, steps: int) -> list[float]:
    """The single-process reference: the dense GPT with `torch.optim.Adam` on the whole global batch."""
    return reference_run(cfg, steps)[0]


def reference_run(cfg: TrainConfig, steps: int) -> tuple[list[float], dict[str, Tensor]]:
    """`reference_losses`, and the dense parameters after the last step (by name): the course's one
    single-process loop, `reference.train_reference`, on `checkpoint_task`."""
    task = checkpoint_task(cfg)
    model = task.build(cfg.seed)
    run = train_reference(model, task.batches(steps, cfg.batch_size, cfg.seed), task.loss,
                          torch.optim.Adam(model.parameters(), lr=cfg.lr))
    return run.losses, run.params
