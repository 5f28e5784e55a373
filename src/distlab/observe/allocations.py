"""Memory over time: the live bytes of one training step, from the profiler's memory events, beside the
peak and the phase chapter 7 predicts.

`torch.profiler.profile(profile_memory=True)` records every allocation and free as a "[memory]" instant
event whose `Total Allocated` is the running total of bytes allocated minus freed since profiling began
(PyTorch profiler documentation, "Using profiler to analyze memory consumption"); the tensors alive before
(the parameters and Adam's state) are the `baseline`. `step_curve` profiles one step of the course's GPT
with a `distlab:forward` / `distlab:backward` / `distlab:optimizer` range around each phase, and returns a
`MemoryCurve`: live bytes over time, the peak, and the phase it falls in. `chapter 7`'s `predict_peak`
gives the prediction (read through `distlab.memory`'s public names).

On CUDA, `torch.cuda.memory._record_memory_history` keeps every allocation with its stack, and
`torch.cuda.memory._snapshot()` (pickled) opens in https://pytorch.org/memory_viz (PyTorch documentation,
"Understanding CUDA Memory Usage"); `snapshot_curve` reads such a snapshot's trace into the same curve.
"""

from __future__ import annotations

import json
import pickle
import tempfile
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from distlab.tensor_parallel.overlap_bench import quiet_native_stderr

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class MemoryCurve:
    """Live bytes at each time (seconds from the step's start), and each phase's window."""

    times: tuple[float, ...]
    live: tuple[int, ...]
    phases: Mapping[str, tuple[float, float]]

    @property
    def peak_bytes(self) -> int:
        return max(self.live)

    @property
    def peak_time(self) -> float:
        return self.times[self.live.index(self.peak_bytes)]

    @property
    def peak_phase(self) -> str:
        """The phase whose window holds the first time the peak is reached ("" if none)."""
        t = self.peak_time
        return next((p for p, (a, b) in self.phases.items() if a <= t <= b), "")


def curve_from_trace(trace: Mapping[str, Any], baseline: int, device_type: int = 0) -> MemoryCurve:
    """The curve of a Chrome trace with memory events (`device_type` 0: CPU, 1: CUDA) and
    `distlab:<phase>` ranges; `baseline` bytes were alive before profiling began."""
    events = trace.get("traceEvents", [])
    mem = _memory_events(events, device_type)
    ranges = _phase_ranges(events)
    if not mem or not ranges:
        raise ValueError("the trace has no memory events or no distlab:<phase> ranges: profile with "
                         "profile_memory=True around record_function('distlab:forward') etc.")
    t0 = min(a for a, _ in ranges.values())
    return MemoryCurve(tuple((t - t0) * 1e-6 for t, _ in mem), tuple(baseline + b for _, b in mem),
                       {p: ((a - t0) * 1e-6, (b - t0) * 1e-6) for p, (a, b) in ranges.items()})


def _memory_events(events: list[dict[str, Any]], device_type: int) -> list[tuple[float, int]]:
    """(timestamp in us, Total Allocated) of each "[memory]" event of `device_type`, in time order."""
    return sorted((float(e["ts"]), int(e["args"]["Total Allocated"])) for e in events
                  if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == device_type)


def _phase_ranges(events: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Each `distlab:<phase>` range's (start, end) in us, by phase name."""
    return {str(e["name"]).split(":", 1)[1]: (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("distlab:")}


def snapshot_curve(snapshot: Mapping[str, Any], baseline: int = 0, device: int = 0
                   ) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """(seconds from the first event, live bytes) from a CUDA memory snapshot's trace of `device`: +size
    on "alloc", -size on "free_completed" (the caching allocator's view of tensors)."""
    traces = snapshot.get("device_traces")
    if not traces or device >= len(traces):
        raise ValueError(f"the snapshot has no trace of device {device}: record with "
                         "torch.cuda.memory._record_memory_history() before the step")
    live, times, values = baseline, [], []
    events = [e for e in traces[device] if e.get("action") in ("alloc", "free_completed")]
    if not events:
        raise ValueError(f"device {device}'s trace has no alloc or free_completed events")
    t0 = events[0]["time_us"]
    for e in events:
        live += e["size"] if e["action"] == "alloc" else -e["size"]
        times.append((e["time_us"] - t0) * 1e-6)
        values.append(live)
    return tuple(times), tuple(values)


def live_tensor_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the parameters, their gradients and the optimizer's state tensors (each storage once)."""
    seen: dict[int, int] = {}
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    for t in tensors:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def step_curve(model: torch.nn.Module, optimizer: torch.optim.Optimizer, idx: torch.Tensor,
               targets: torch.Tensor, snapshot_to: str | Path | None = None) -> MemoryCurve:
    """Profile one step (zero_grad(set_to_none), forward, backward, optimizer) after one warm-up step, and
    return its curve. On CUDA with `snapshot_to`, also record the allocator's history and write the
    pickled snapshot there (open it in memory_viz)."""
    def step(mark: bool) -> None:
        optimizer.zero_grad(set_to_none=True)
        for phase in PHASES:
            with record_function(f"distlab:{phase}") if mark else nullcontext():
                if phase == "forward":
                    loss = model(idx, targets)[1]
                elif phase == "backward":
                    loss.backward()
                else:
                    optimizer.step()

    step(False)
    optimizer.zero_grad(set_to_none=True)
    cuda = idx.device.type == "cuda"
    baseline = live_tensor_bytes(model, optimizer)
    if cuda and snapshot_to is not None:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=acts, profile_memory=True)
    with quiet_native_stderr():
        prof.start()
    step(True)
    if cuda:
        torch.cuda.synchronize(idx.device)
    with quiet_native_stderr():
        prof.stop()
    if cuda and snapshot_to is not None:
        Path(snapshot_to).write_bytes(pickle.dumps(torch.cuda.memory._snapshot()))
        torch.cuda.memory._record_memory_history(enabled=None)
    path = Path(snapshot_to or ".").with_suffix(".trace.json") if snapshot_to else None
    trace = _trace_dict(prof, path)
    return curve_from_trace(trace, baseline, 1 if cuda else 0)


def _trace_dict(prof: profile, path: Path | None) -> dict[str, Any]:
    if path is None:
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / f"memory-{time.monotonic_ns()}.json"
            prof.export_chrome_trace(str(f))
            return json.loads(f.read_text())
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def gpt_step_curve(layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 256, batch: int = 8,
                   seq: int = 32, seed: int = 0, device: torch.device | None = None,
                   snapshot_to: str | Path | None = None) -> MemoryCurve:
    """`step_curve` of the course's GPT with fp32 Adam (the for-loop form), built and fed as chapter 7's
    `measure_gpt_step` does, so that `distlab.memory.predict_peak` of the same `MemoryConfig` predicts it."""
    from distlab.models import GPT, GPTConfig

    dev = device or torch.device("cpu")
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=seq, n_layer=layers, n_head=heads, n_embd=hidden,
                          bias=True)).to(dev)
    g = torch.Generator().manual_seed(seed)
    idx, y = (torch.randint(vocab, (batch, seq), generator=g).to(dev) for _ in range(2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    return step_curve(model, optimizer, idx, y, snapshot_to)
