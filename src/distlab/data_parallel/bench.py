"""Measuring data-parallel training: throughput per strategy, against DDP, and its scaling with ranks.

`measure` runs inside the ranks. It builds one copy of the benchmark model per strategy (by default
`bench_task()`, a GPT of 3.2 million parameters in 52 tensors, so that the all-reduce of its gradients
costs about as much as its computation on a CPU, and bucketing matters), and times blocks of `steps`
training steps of each, in rotating order over `rounds` rounds, so that noise on the machine hits every
strategy alike (the course's one timing loop, `distlab.timing.time_interleaved`). The strategies are
ours from `sync`, "ddp" (PyTorch's DistributedDataParallel with the same bucket cap, Li et al. 2020,
"PyTorch Distributed", VLDB 13(12)) and "compute" (the same step with no communication at all, the
ideal). A block's time is the slowest rank's; a result is the median over rounds. The last step of
each of our strategies is also recorded as a `StepTimeline`.

Each rank gets `threads` threads (default 1): a rank stands for one device, as one GPU would. The
benchmark runs in a process group `group` (None: the whole world), like the training loop.

`cost_model.predict_step_seconds` is the alpha-beta prediction of a step, which the lab and the book's
scaling figure put beside the measurement. The command line is `python -m distlab.data_parallel`.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from distlab import launch, sharding, timing
from distlab.data_parallel.buckets import check_bucket_bytes
from distlab.data_parallel.sync import group_size_and_rank, make_strategy
from distlab.data_parallel.timeline import StepTimeline
from distlab.data_parallel.train import broadcast_parameters
from distlab.reference import SGD, Task, gpt_task

BENCH_BUCKET_BYTES = 4 << 20  # fewer, larger messages suit a CPU, where overlap shares the cores
ALL_STRATEGIES = ("per_parameter", "bucketed", "overlapped", "ddp", "compute")
WARMUP = 2  # untimed steps of each strategy: allocations, first calls, DDP's bucket rebuild after step 1


@dataclass(frozen=True)
class Result:
    """One strategy on one world size: the median seconds per step and samples per second (global)."""

    strategy: str
    world_size: int
    per_rank_batch: int
    step_seconds: float
    timeline: StepTimeline | None = None

    @property
    def samples_per_second(self) -> float:
        return self.world_size * self.per_rank_batch / self.step_seconds


def _sync_device(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bench_task(n: int = 64) -> Task:
    """The benchmark's model and data: a GPT with 4 layers of width 256 (3.2 M parameters, 12.7 MB of
    float32 gradients in 52 tensors) on `n` windows of 16 characters."""
    return gpt_task(n_layer=4, n_embd=256, block_size=16, n=n)


def grad_bytes(model: nn.Module) -> int:
    """Bytes of the gradients of `model`'s trainable parameters (a tied weight counts once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


class _Runner:
    """One strategy's model, optimizer and step function, on this rank."""

    def __init__(self, strategy: str, task: Task, bucket_bytes: int, dev: torch.device,
                 group: dist.ProcessGroup | None) -> None:
        self.strategy, self.dev, self.task = strategy, dev, task
        self.model = task.build(0).to(dev)
        broadcast_parameters(self.model, group)
        self.events: list[tuple[int, int, float, float]] = []
        self.sync = None
        self.net: nn.Module = self.model
        if strategy == "ddp":
            self.net = nn.parallel.DistributedDataParallel(self.model, bucket_cap_mb=bucket_bytes / 2**20,
                                                           process_group=group)
        elif strategy != "compute":
            self.sync = make_strategy(strategy, self.model, bucket_bytes, group=group, events=self.events)
        self.optimizer = SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.timeline: StepTimeline | None = None

    def step(self, x: torch.Tensor, y: torch.Tensor, record: bool = False) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.task.loss(self.net, x, y)
        self.events.clear()
        if self.sync is not None:  # record only when asked: the overlapped strategy's completion
            self.sync.events = self.events if record else None  # callbacks cost a little on every bucket
        _sync_device(self.dev)
        t0 = time.perf_counter()
        loss.backward()
        _sync_device(self.dev)
        t1 = time.perf_counter()
        if self.sync is not None:
            self.sync.finish()
        self.optimizer.step()
        if record and self.sync is not None:
            self.timeline = StepTimeline.from_events(self.strategy, t0, t1, self.events)


def check_settings(strategies: Sequence[str], per_rank_batch: int, steps: int, rounds: int,
                   bucket_bytes: int) -> None:
    """Raise a ValueError that names the first bad setting of a benchmark and what to pass instead."""
    unknown = [s for s in strategies if s not in ALL_STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"strategies {list(strategies)} must be one or more of {', '.join(ALL_STRATEGIES)}")
    for name, value in (("per_rank_batch", per_rank_batch), ("steps", steps), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer, e.g. {name}=2")
    check_bucket_bytes(bucket_bytes)


def measure(strategies: Sequence[str] = ALL_STRATEGIES, per_rank_batch: int = 2, steps: int = 5,
            rounds: int = 5, bucket_bytes: int = BENCH_BUCKET_BYTES, task: Task | None = None,
            threads: int | None = 1, group: dist.ProcessGroup | None = None) -> list[Result]:
    """Inside the ranks of `group` (None: the whole world): time every strategy, interleaved (see the
    module docstring). Every rank returns the same list of results."""
    check_settings(strategies, per_rank_batch, steps, rounds, bucket_bytes)
    if threads is not None:
        torch.set_num_threads(threads)
    dev = launch.device()
    p, rank = group_size_and_rank(group)
    task = task if task is not None else bench_task(max(64, p * per_rank_batch))
    if p * per_rank_batch > len(task):
        raise ValueError(f"per_rank_batch={per_rank_batch} on {p} ranks needs {p * per_rank_batch} examples "
                         f"and the task has {len(task)}; choose per_rank_batch <= {len(task) // p}")
    mine = sharding.shard(p * per_rank_batch, rank, p)  # this rank's examples, the same every step
    x, y = task.inputs[mine].to(dev), task.targets[mine].to(dev)
    runners = [_Runner(s, task, bucket_bytes, dev, group) for s in strategies]
    last = WARMUP + rounds * steps  # each runner's last step, the one whose timeline is recorded

    def step_of(r: _Runner) -> Callable[[], None]:
        count = itertools.count(1)
        return lambda: r.step(x, y, record=next(count) == last)

    times = timing.time_interleaved([step_of(r) for r in runners], steps, rounds, warmup=WARMUP, group=group,
                                    device=dev)
    for r in runners:
        if r.sync is not None:
            r.sync.close()
    return [Result(r.strategy, p, per_rank_batch, statistics.median(times[:, j].tolist()), r.timeline)
            for j, r in enumerate(runners)]


def benchmark(world_sizes: Sequence[int] = (1, 2, 3, 4), strategies: Sequence[str] = ALL_STRATEGIES,
              per_rank_batch: int = 2, steps: int = 5, rounds: int = 5,
              bucket_bytes: int = BENCH_BUCKET_BYTES, task: Task | None = None,
              threads: int | None = 1, progress: bool = True, timeout: float = 120.0) -> list[Result]:
    """Run `measure` on each world size (one launch each) and return all results."""
    from tqdm.auto import tqdm

    check_settings(strategies, per_rank_batch, steps, rounds, bucket_bytes)

    out: list[Result] = []
    for p in tqdm(list(world_sizes), desc="world sizes", disable=not progress, leave=False):
        out += launch.run(measure, p, strategies, per_rank_batch, steps, rounds, bucket_bytes, task,
                          threads, timeout=timeout)[0]
    return out


def ratio_to_ddp(results: Sequence[Result], strategy: str = "overlapped") -> dict[int, float]:
    """Throughput of `strategy` over DDP's, per world size (1.0 = as fast as DDP)."""
    by = {(r.strategy, r.world_size): r for r in results}
    return {p: by[(strategy, p)].samples_per_second / by[("ddp", p)].samples_per_second
            for s, p in by if s == strategy and ("ddp", p) in by}


def format_results(results: Sequence[Result]) -> str:
    """A table: one row per world size and strategy, with ms/step, samples/s and the hidden fraction."""
    lines = [f"{'ranks':>5} {'strategy':<14} {'ms/step':>8} {'samples/s':>10} {'comm hidden':>12}"]
    for r in sorted(results, key=lambda r: (r.world_size, ALL_STRATEGIES.index(r.strategy))):
        hidden = f"{r.timeline.hidden_fraction:.0%}" if r.timeline and r.timeline.comm_seconds else ""
        lines.append(f"{r.world_size:>5} {r.strategy:<14} {r.step_seconds * 1e3:>8.1f} "
                     f"{r.samples_per_second:>10.0f} {hidden:>12}")
    return "\n".join(lines)

