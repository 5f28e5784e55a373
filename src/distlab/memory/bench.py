"""Our ZeRO beside PyTorch's: ZeRO-1 against `ZeroRedundancyOptimizer`, ZeRO-3 against FSDP2.

PyTorch ships both ideas: `torch.distributed.optim.ZeroRedundancyOptimizer` shards the optimizer state
(stage 1; it runs beside DistributedDataParallel, which all-reduces the gradients, and broadcasts each
rank's updated parameters), and FSDP2, `torch.distributed.fsdp.fully_shard`, shards parameters, gradients
and optimizer state per module (stage 3; Zhao et al. 2023, "PyTorch FSDP", VLDB 16(12)). Both run on gloo
on the CPU; FSDP2 needs a DeviceMesh, made here from the group with `DeviceMesh.from_group`.

Ours come in two forms: the chapter's engine (`zero1`, `zero3`: `ZeRO(model, stage)` with its own
Adam) and the torch-style API (`sharded1`, `sharded2`: `ShardedOptimizer(params, torch.optim.AdamW,
stage=1 or 2)`; `sharded3`: `fully_shard` on every block and the root, then `torch.optim.AdamW`), each
timed against the same built-in. Every contender trains the same model on the same batch with the same
update: AdamW at lr 1e-2 without weight decay, which is also the engine's Adam, step for step. PyTorch's
are set up as their documentation shows: DDP (default buckets, so the all-reduce overlaps the backward)
with `ZeroRedundancyOptimizer(params, AdamW)`, and FSDP2 on every block and the root. `train_builtin`
trains the chapter's task with one of them, for the loss comparison in the tests.

`measure_rounds` runs inside the ranks: after two warm-up steps of each contender (first calls, DDP's
bucket rebuild), it times blocks of `steps` steps of ours and theirs side by side, in rotating order over
`rounds`, so that load on the machine hits every contender alike; a block's time is the slowest rank's
(the course's one timing loop, `distlab.timing.time_interleaved`).
`measure` gives the median over rounds; `paired_ratios` ours / theirs in steps per second (above 1: ours
is faster) round by round, whose median and spread the command line prints. From a shell:

    python -m distlab.memory.bench --world-size 2 4 --rounds 9
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

from distlab import launch
from distlab.cli_types import positive_int
from distlab.memory.zero import ShardedOptimizer, ZeRO, default_units
from distlab.memory.zero.fsdp import fully_shard as zero_fully_shard
from distlab.memory.zero.parity import GLOBAL_BATCH, LR, SEED, RunResult, zero_task
from distlab.reference import Task, group_mean
from distlab.timing import time_interleaved

CONTENDERS = ("zero1", "sharded1", "sharded2", "zero_redundancy", "zero3", "sharded3", "fsdp2")
PAIRS = {"zero1": "zero_redundancy", "sharded1": "zero_redundancy", "sharded2": "zero_redundancy",
         "zero3": "fsdp2", "sharded3": "fsdp2"}  # ours -> theirs
WARMUP = 2


def bench_task(n_layer: int = 4, n_embd: int = 64) -> Task:
    """The benchmark's model: by default a GPT of 4 blocks of width 64 (0.2 M parameters, 4 units plus
    the root)."""
    return zero_task("gpt", n_layer=n_layer, n_embd=n_embd, block_size=16)


def _adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.0)


class _Runner:
    """One contender's model and optimizer on this rank, and its training step."""

    def __init__(self, kind: str, task: Task, group: dist.ProcessGroup | None) -> None:
        if kind not in CONTENDERS:
            raise ValueError(f"kind={kind!r} is unknown; choose one of {', '.join(CONTENDERS)}")
        self.kind, self.task = kind, task
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.model = task.build(SEED)
        self.net: nn.Module = self.model
        self.engine: ZeRO | None = None
        if kind.startswith("zero") and kind[-1].isdigit():
            self.engine = ZeRO(self.model, int(kind[-1]), group, lr=LR)
        elif kind in ("sharded1", "sharded2"):
            self.optimizer = ShardedOptimizer(self.model.parameters(), torch.optim.AdamW, group=group,
                                              stage=int(kind[-1]), lr=LR, weight_decay=0.0)
        elif kind == "sharded3":
            for unit in [*default_units(self.model), self.model]:
                zero_fully_shard(unit, group=group)
            self.optimizer = _adamw(self.model.parameters())
        elif kind == "zero_redundancy":
            self.net = nn.parallel.DistributedDataParallel(self.model, process_group=group)
            self.optimizer = ZeroRedundancyOptimizer(self.model.parameters(), torch.optim.AdamW,
                                                     process_group=group, lr=LR, weight_decay=0.0)
        else:
            mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
            for unit in default_units(self.model):
                fully_shard(unit, mesh=mesh)
            fully_shard(self.model, mesh=mesh)
            self.optimizer = _adamw(self.model.parameters())

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step on this rank's rows of the global batch (x, y) (`Task.shard_backward`);
        returns this rank's share of the loss."""
        if self.engine is not None:
            self.engine.zero_grad()
        else:
            self.optimizer.zero_grad()
        loss = self.task.shard_backward(self.net, x, y, self.rank, self.world)
        (self.engine or self.optimizer).step()
        return loss


def train_builtin(kind: str, task: Task, steps: int = 4, group: dist.ProcessGroup | None = None) -> RunResult:
    """Inside the ranks: train `task` with contender `kind` and return its losses (global means)."""
    runner = _Runner(kind, task, group)
    losses = [group_mean(runner.step(*task.batch(s, GLOBAL_BATCH, SEED)), group) for s in range(steps)]
    return RunResult(losses, {})


def measure_rounds(kinds: Sequence[str] = CONTENDERS, steps: int = 3, rounds: int = 5,
                   group: dist.ProcessGroup | None = None, threads: int | None = 1,
                   task: Task | None = None) -> dict[str, list[float]]:
    """Inside the ranks: seconds per step of each contender in each round, interleaved (see above)."""
    if threads is not None:
        torch.set_num_threads(threads)
    task = task or bench_task()
    x, y = task.batch(0, GLOBAL_BATCH, SEED)
    runners = [_Runner(k, task, group) for k in kinds]
    times = time_interleaved([functools.partial(r.step, x, y) for r in runners], steps, rounds, warmup=WARMUP,
                             group=group, device=torch.device("cpu"))  # every contender runs on the CPU
    return {r.kind: times[:, j].tolist() for j, r in enumerate(runners)}


def _measure_sized(kinds: Sequence[str], steps: int, rounds: int, n_layer: int,
                   n_embd: int) -> dict[str, list[float]]:
    return measure_rounds(kinds, steps, rounds, task=bench_task(n_layer, n_embd))


def measure(kinds: Sequence[str] = CONTENDERS, steps: int = 3, rounds: int = 5,
            group: dist.ProcessGroup | None = None, threads: int | None = 1,
            task: Task | None = None) -> dict[str, float]:
    """Inside the ranks: median seconds per step of each contender over the rounds."""
    times = measure_rounds(kinds, steps, rounds, group, threads, task)
    return {kind: statistics.median(ts) for kind, ts in times.items()}


def speed_ratios(seconds: dict[str, float]) -> dict[str, float]:
    """Ours over theirs in steps per second, for each pair measured: 1.0 = as fast, above = faster."""
    return {f"{ours} / {theirs}": seconds[theirs] / seconds[ours]
            for ours, theirs in PAIRS.items() if ours in seconds and theirs in seconds}


def paired_ratios(times: dict[str, list[float]]) -> dict[str, list[float]]:
    """`speed_ratios` round by round (ours and theirs timed within one round, under the same load)."""
    rounds = len(next(iter(times.values()), []))
    per_round = [speed_ratios({k: ts[r] for k, ts in times.items()}) for r in range(rounds)]
    return {name: [rs[name] for rs in per_round] for name in (per_round[0] if per_round else {})}


def format_results(seconds: dict[str, float], times: dict[str, list[float]] | None = None) -> str:
    """A table of milliseconds per step (medians), then the ratios; with every round's `times`, the
    median of the per-round ratios and their range too."""
    lines = [f"{'contender':<16} {'ms/step':>8}"]
    lines += [f"{k:<16} {v * 1e3:>8.1f}" for k, v in seconds.items()]
    if times is None:
        lines += [f"speed {name}: {ratio:.2f}x" for name, ratio in speed_ratios(seconds).items()]
    else:
        lines += [f"speed {name}: {statistics.median(rs):.2f}x (rounds: {min(rs):.2f}-{max(rs):.2f}x)"
                  for name, rs in paired_ratios(times).items()]
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
    parser.add_argument("--n-layer", type=positive_int, default=4, help="blocks of the benchmark's GPT")
    parser.add_argument("--n-embd", type=positive_int, default=64, help="width of the benchmark's GPT")
    args = parser.parse_args(argv)
    out = {}
    for n in args.world_size if isinstance(args.world_size, list) else [args.world_size]:
        times = launch.run(_measure_sized, n, args.kinds, args.steps, args.rounds, args.n_layer, args.n_embd,
                           timeout=600.0)[0]
        out[n] = {kind: statistics.median(ts) for kind, ts in times.items()}
        print(f"--- {n} ranks\n{format_results(out[n], times)}", flush=True)
    return out


if __name__ == "__main__":
    main()
