"""Profiled training steps on a rank: chapter 2's data parallelism and chapter 5's tensor parallelism
under `torch.profiler`, each rank writing its Chrome trace, beside what the chapters' own logs report.

`profile_data_parallel` runs a warm-up step, then `steps` profiled steps of one gradient strategy of
chapter 2 (`per_parameter`, `bucketed`, `overlapped`; with `accumulate` > 1 the first micro-batches run
inside `no_sync`), each inside a `distlab:step` range, each backward pass inside a `distlab:backward`
one. The warm-up step runs under `comm_log` (the course's count of collectives; its dispatch mode slows
every operator, so it stays out of the traced steps, which issue the same collectives). It returns the
trace's path, the count and bytes of all-reduces `comm_log` saw per step times `steps`, and chapter 2's
own `StepTimeline` of each step (its perf_counter times of backward and each all-reduce), which
`overlap` is checked against. `profile_tensor_parallel` writes the traces of chapter 5's
sequence-parallel MLP step, plain and with collective matmuls.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from distlab import launch, sharding
from distlab.comm_log import comm_log
from distlab.data_parallel import StepTimeline, broadcast_parameters, make_strategy
from distlab.observe.trace import BACKWARD_LABEL, STEP_LABEL
from distlab.reference import SGD, Task, gpt_task
from distlab.tensor_parallel.overlap_bench import quiet_native_stderr


def activities(dev: torch.device) -> list[ProfilerActivity]:
    """What to profile on `dev`: the CPU, and CUDA kernels on a GPU."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])


def dp_task() -> Task:
    """The traced model: a GPT with 2 layers of width 128 (0.4 M parameters in 28 tensors)."""
    return gpt_task(n_layer=2, n_embd=128, block_size=16, n=32)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def profile_data_parallel(out_dir: str, strategy: str, steps: int = 2, accumulate: int = 1,
                          bucket_bytes: int = 1 << 18, per_rank_batch: int = 4) -> dict[str, Any]:
    """On a rank: profile `steps` steps of chapter 2's `strategy`; see the module docstring."""
    if steps < 1 or accumulate < 1:
        raise ValueError(f"steps={steps} and accumulate={accumulate} must be >= 1")
    torch.set_num_threads(1)
    dev, rank, world = launch.device(), dist.get_rank(), dist.get_world_size()
    task = dp_task()
    model = task.build(0).to(dev)
    broadcast_parameters(model, None)
    events: list[tuple[int, int, float, float]] = []
    sync = make_strategy(strategy, model, bucket_bytes, events=events)
    optimizer = SGD(model.parameters(), lr=1e-3, momentum=0.9)
    gx, gy = task.batch(0, world * per_rank_batch, 0)
    mine = sharding.uneven_shard(len(gx), rank, world)
    x, y = gx[mine].to(dev), gy[mine].to(dev)
    timelines: list[StepTimeline] = []

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        events.clear()
        for micro in range(accumulate):
            with sync.no_sync() if micro < accumulate - 1 else nullcontext():
                loss = task.loss(model, x, y)
                _sync(dev)
                t0 = time.perf_counter()
                with record_function(BACKWARD_LABEL):  # inside [t0, t1]: the trace's backward windows
                    loss.backward()
                    _sync(dev)
                t1 = time.perf_counter()
        sync.finish()
        optimizer.step()
        timelines.append(StepTimeline.from_events(strategy, t0, t1, events))

    with comm_log() as log:  # a warm-up step, counted (the log's dispatch mode would slow a traced step)
        step()
    timelines.clear()
    prof = profile(activities=activities(dev))
    with quiet_native_stderr():
        prof.start()
    for _ in range(steps):
        with record_function(STEP_LABEL):
            step()
            _sync(dev)
    with quiet_native_stderr():
        prof.stop()
    path = Path(out_dir) / f"{strategy}-x{accumulate}-rank{rank}.json"
    prof.export_chrome_trace(str(path))
    return {"trace": str(path), "calls": steps * log.calls(op="all_reduce"),
            "bytes": steps * log.bytes(op="all_reduce"), "timelines": timelines}


def profile_tensor_parallel(out_dir: str, iters: int = 3) -> dict[str, Any]:
    """On a rank: chapter 5's `time_overlap` (a sequence-parallel MLP step, plain and with collective
    matmuls) with its traces written to `out_dir`; its result, with the traces' full paths."""
    from distlab.tensor_parallel.overlap_bench import time_overlap

    out = time_overlap(hidden=128, batch=2, seq=64, iters=iters, trace_dir=out_dir)
    out["traces"] = [str(Path(out_dir) / name) for name in out["traces"]]
    out["iters"] = iters
    return out
