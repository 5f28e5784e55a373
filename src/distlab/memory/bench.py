"""Our ZeRO beside PyTorch's: ZeRO-1 against `ZeroRedundancyOptimizer`, ZeRO-3 against FSDP2.

PyTorch ships both ideas: `torch.distributed.optim.ZeroRedundancyOptimizer` shards the optimizer state
(stage 1; it runs beside DistributedDataParallel, which all-reduces the gradients, and broadcasts each
rank's updated parameters), and FSDP2, `torch.distributed.fsdp.fully_shard`, shards parameters, gradients
and optimizer state per module (stage 3; Zhao et al. 2023, "PyTorch FSDP", VLDB 16(12)). Both run on gloo
on the CPU; FSDP2 needs a DeviceMesh, made here from the group with `DeviceMesh.from_group`.

Ours come in two forms: the chapter's engine (`zero1`, `zero3`: `ZeRO(model, stage)` with its own
Adam) and the torch-style API (`sharded1`: `ShardedOptimizer(params, torch.optim.Adam)`; `sharded3`:
`fully_shard` on every block and the root, then `torch.optim.Adam`), each timed against the same
built-in. `train_builtin` trains the chapter's task with one of them, for the loss comparison in the tests.
`measure` runs inside the ranks and times blocks of steps of ours and theirs side by side, in rotating
order over rounds, so that load on the machine hits every contender alike; a block's time is the slowest
rank's and a result the median over rounds. `speed_ratios` gives ours / theirs in steps per second
(above 1: ours is faster). From a shell:

    python -m distlab.memory.bench --world-size 2 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

from distlab import launch, sharding
from distlab.cli_types import positive_int
from distlab.memory.zero import ShardedOptimizer, ZeRO, default_units
from distlab.memory.zero.fsdp import fully_shard as zero_fully_shard
from distlab.memory.zero.parity import GLOBAL_BATCH, LR, SEED, RunResult, group_mean, zero_task
from distlab.reference import Task

CONTENDERS = ("zero1", "sharded1", "zero_redundancy", "zero3", "sharded3", "fsdp2")
PAIRS = {"zero1": "zero_redundancy", "sharded1": "zero_redundancy", "zero3": "fsdp2",
         "sharded3": "fsdp2"}  # ours -> theirs


def bench_task() -> Task:
    """The benchmark's model: a GPT of 4 blocks of width 64 (0.2 M parameters, 4 units plus the root)."""
    return zero_task("gpt", n_layer=4, n_embd=64, block_size=16)


class _Runner:
    """One contender's model and optimizer on this rank, and its training step."""

    def __init__(self, kind: str, task: Task, group: dist.ProcessGroup | None) -> None:
        if kind not in CONTENDERS:
            raise ValueError(f"kind={kind!r} is unknown; choose one of {', '.join(CONTENDERS)}")
        self.kind, self.task = kind, task
        self.model = task.build(SEED)
        self.net: nn.Module = self.model
        self.engine: ZeRO | None = None
        if kind.startswith("zero") and kind[-1].isdigit():
            self.engine = ZeRO(self.model, int(kind[-1]), group, lr=LR)
        elif kind == "sharded1":
            self.optimizer = ShardedOptimizer(self.model.parameters(), torch.optim.Adam, group=group, lr=LR)
        elif kind == "sharded3":
            for unit in [*default_units(self.model), self.model]:
                zero_fully_shard(unit, group=group)
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR)
        elif kind == "zero_redundancy":
            self.net = nn.parallel.DistributedDataParallel(self.model, process_group=group)
            self.optimizer = ZeroRedundancyOptimizer(self.model.parameters(), torch.optim.Adam,
                                                     process_group=group, lr=LR)
        else:
            mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
            for unit in default_units(self.model):
                fully_shard(unit, mesh=mesh)
            fully_shard(self.model, mesh=mesh)
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step on this rank's batch; returns the local loss."""
        if self.engine is not None:
            self.engine.zero_grad()
        else:
            self.optimizer.zero_grad()
        loss = self.task.loss(self.net, x, y)
        loss.backward()
        (self.engine or self.optimizer).step()
        return loss


def _my_batch(task: Task, step: int, group: dist.ProcessGroup | None) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = task.batch(step, GLOBAL_BATCH, SEED)
    mine = sharding.shard(len(x), dist.get_rank(group), dist.get_world_size(group))
    return x[mine], y[mine]


def train_builtin(kind: str, task: Task, steps: int = 4, group: dist.ProcessGroup | None = None) -> RunResult:
    """Inside the ranks: train `task` with contender `kind` and return its losses (global means)."""
    runner = _Runner(kind, task, group)
    losses = [group_mean(runner.step(*_my_batch(task, s, group)), group) for s in range(steps)]
    return RunResult(losses, {})


def measure(kinds: Sequence[str] = CONTENDERS, steps: int = 3, rounds: int = 5,
            group: dist.ProcessGroup | None = None, threads: int | None = 1,
            task: Task | None = None) -> dict[str, float]:
    """Inside the ranks: median seconds per step of each contender, interleaved (see the docstring)."""
    if threads is not None:
        torch.set_num_threads(threads)
    task = task or bench_task()
    x, y = _my_batch(task, 0, group)
    runners = [_Runner(k, task, group) for k in kinds]
    for r in runners:  # warm-up: first calls, allocations
        r.step(x, y)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for k in range(rounds):
        for j in range(len(runners)):
            r = runners[(j + k) % len(runners)]
            dist.barrier(group=group)
            t0 = time.perf_counter()
            for _ in range(steps):
                r.step(x, y)
            block = torch.tensor([(time.perf_counter() - t0) / steps], dtype=torch.float64)
            dist.all_reduce(block, op=dist.ReduceOp.MAX, group=group)
            times[r.kind].append(block.item())
    return {kind: statistics.median(ts) for kind, ts in times.items()}


def speed_ratios(seconds: dict[str, float]) -> dict[str, float]:
    """Ours over theirs in steps per second, for each pair measured: 1.0 = as fast, above = faster."""
    return {f"{ours} / {theirs}": seconds[theirs] / seconds[ours]
            for ours, theirs in PAIRS.items() if ours in seconds and theirs in seconds}


def format_results(seconds: dict[str, float]) -> str:
    """A table of milliseconds per step, then the ratios."""
    lines = [f"{'contender':<16} {'ms/step':>8}"]
    lines += [f"{k:<16} {v * 1e3:>8.1f}" for k, v in seconds.items()]
    lines += [f"speed {name}: {ratio:.2f}x" for name, ratio in speed_ratios(seconds).items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[int, dict[str, float]]:
    """Command line: start the ranks, measure every contender, print the table and the ratios."""
    parser = argparse.ArgumentParser(prog="python -m distlab.memory.bench",
                                     description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--world-size", type=positive_int, nargs="+", default=2,  # several: one run each
                        help="ranks to start")
    parser.add_argument("--steps", type=positive_int, default=3, help="steps per timed block")
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed blocks per contender (median)")
    parser.add_argument("--kinds", nargs="+", default=list(CONTENDERS), choices=CONTENDERS,
                        help="contenders to time")
    args = parser.parse_args(argv)
    out = {}
    for n in args.world_size if isinstance(args.world_size, list) else [args.world_size]:
        out[n] = launch.run(measure, n, args.kinds, args.steps, args.rounds, timeout=600.0)[0]
        print(f"--- {n} ranks\n{format_results(out[n])}", flush=True)
    return out


if __name__ == "__main__":
    main()
