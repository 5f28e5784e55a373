"""Measure what a collective matmul hides: a sequence-parallel MLP step, plain beside overlapped.

`time_overlap` runs on every rank of a group. It builds chapter 5's sequence-parallel `ParallelMLP`
(blocking all-gather before c_fc, blocking reduce-scatter after c_proj; Korthikanti et al. 2022) and a
copy with the same weights whose two layers are collective matmuls (`collective_matmul`, Wang et al.
2023), checks that both give the same output, then times forward + backward steps of each under
`torch.profiler` and reports:

- the median step time of each, and their ratio (overlapped / plain);
- the *exposed* communication: the time the rank's compute thread sat waiting for data, per step. For
  the plain step that is each blocking collective from its start to its end (`_BlockingWaits` waits on
  the collective's `Work` inside a profiler range named "communication.wait", where `dist.all_gather`
  would have waited anyway); for the overlapped one, the ring's waits ("collective_matmul.wait").

With `trace_dir`, each rank writes a Chrome/Perfetto trace of each variant there
(`collective_matmul_plain_rank0.json`, ...), to open in ui.perfetto.dev.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from distlab.mesh import group_rank, group_size
from distlab.models import GPTConfig
from distlab.tensor_parallel.collective_matmul import overlap_collective_matmuls
from distlab.tensor_parallel.comm import Group
from distlab.tensor_parallel.model import ParallelMLP
from distlab.timing import median_seconds, sample_seconds

WAITS = ("communication.wait", "collective_matmul.wait")  # the profiler ranges that count as exposed


class _BlockingWaits(TorchDispatchMode):
    """Wait for every c10d collective (not send/recv) right where it is issued, inside a profiler range
    "communication.wait": the time the blocking call keeps the compute thread from going on."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func.namespace == "c10d" and func._opname not in ("send", "recv_", "barrier"):
            work = out[-1] if isinstance(out, (tuple, list)) else out
            with record_function("communication.wait"):
                dist.distributed_c10d.Work.unbox(work).wait()
        return out


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Send what native code writes to file descriptor 2 to /dev/null for the block: the profiler's
    start and stop lines, which carry a time and a process id (a lab's output must not). Chapter 13's
    profiled runs use it too."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _profiled_steps(step: Callable[[], None], iters: int, group: Group,
                    trace: Path | None) -> tuple[float, float]:
    """(median seconds per step, seconds of exposed communication per step) over `iters` steps."""
    step()  # warm-up
    prof = profile(activities=[ProfilerActivity.CPU])
    with quiet_native_stderr():
        prof.start()
    times = sample_seconds(step, iters, warmup=0, group=group, barrier=True)
    with quiet_native_stderr():
        prof.stop()
    waited = sum(e.cpu_time_total for e in prof.events() if e.name in WAITS) / 1e6
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    return statistics.median(times), waited / iters


def time_overlap(hidden: int = 256, batch: int = 4, seq: int = 128, iters: int = 5, *, group: Group = None,
                 trace_dir: str | None = None) -> dict[str, object]:
    """Median seconds per forward + backward step of a sequence-parallel MLP, plain and overlapped, on
    this rank of `group` (None = the world); their exposed communication per step; `max_diff`, the
    largest difference of the two outputs; `traces`, the trace files written (names inside
    `trace_dir`)."""
    rank, p = group_rank(group), group_size(group)
    if seq % p:
        raise ValueError(f"seq={seq} is not divisible by the group's size {p}; sequence parallelism gives "
                         f"every rank seq/p tokens: use a multiple of {p}")
    config = GPTConfig(vocab_size=p, n_embd=hidden, n_head=p)
    torch.manual_seed(0)
    plain = ParallelMLP(config, group=group, sequence_parallel=True, name="mlp")
    overlapped = ParallelMLP(config, group=group, sequence_parallel=True, name="mlp")
    overlapped.load_state_dict(plain.state_dict())
    overlap_collective_matmuls(overlapped)
    x = torch.randn(batch, seq // p, hidden, generator=torch.Generator().manual_seed(1 + rank))
    out: dict[str, object] = {"max_diff": (plain(x) - overlapped(x)).abs().max().item(), "traces": []}

    def step(model: torch.nn.Module, blocking: bool) -> Callable[[], None]:
        def run() -> None:
            xi = x.clone().requires_grad_(True)
            with _BlockingWaits() if blocking else contextlib.nullcontext():
                model(xi).sum().backward()
        return run

    for name, model in (("plain", plain), ("overlapped", overlapped)):
        trace = None
        if trace_dir is not None:
            Path(trace_dir).mkdir(parents=True, exist_ok=True)
            trace = Path(trace_dir) / f"collective_matmul_{name}_rank{rank}.json"
            out["traces"].append(trace.name)  # type: ignore[union-attr]
        out[f"{name}_s"], out[f"{name}_exposed_s"] = _profiled_steps(step(model, name == "plain"), iters,
                                                                     group, trace)
    out["overlapped_over_plain"] = out["overlapped_s"] / out["plain_s"]  # type: ignore[operator]
    return out


def matmul_seconds(m: int, k: int, n: int, p: int, iters: int = 5) -> tuple[float, float]:
    """Median seconds, in this process, of an (m, k) x (k, n) float32 matmul and of one of its p chunks
    of m/p rows: the t_mm and t_c of `overlap_cost`, measured."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    chunk = a[: m // p].contiguous()
    return median_seconds(lambda: a @ b, iters), median_seconds(lambda: chunk @ b, iters)
