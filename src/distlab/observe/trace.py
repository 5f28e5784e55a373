"""Per-rank profiler traces as spans of computation and communication, and one merged timeline.

`torch.profiler` writes a Chrome trace per process (the Trace Event Format: "X" events with a start `ts`
and a duration `dur` in microseconds, on a `pid` and a `tid`; PyTorch profiler documentation, "Use
profiler to analyze execution time" and "Using tracing functionality"). What each kind of work looks like:

- computation on a CPU rank: the operators (`cat` "cpu_op") on the rank's main thread, where the forward,
  autograd's backward and the optimizer run, except those that hold a collective: a blocking collective
  waits inside its caller's range (autograd's `evaluate_function` node around a backward that
  all-gathers, a dispatch mode's `PythonDispatchMode`), and waiting is not computing. `c10d::` operators
  only enqueue work. On a GPU rank: the kernels (`cat` "kernel") that are not NCCL's;
- communication on gloo: a `gloo:all_reduce` (`gloo:broadcast`, ...) range on one of the group's worker
  threads, from the moment the worker takes the work to its end; the `c10d::allreduce_` operator on the
  main thread only enqueues it. On NCCL: the `ncclDevKernel_...` kernels on the communication stream.

`spans` reads one rank's trace into `Span`s (its rows: "main", "gloo thread 1", "stream 7", ...), and
`merge` writes the ranks' traces as one trace with pid = rank, which Perfetto (ui.perfetto.dev) and
chrome://tracing open as one timeline with a row per rank and thread. The ranks of one machine share its
monotonic clock, so their times line up; across machines they would need aligning first (Holistic Trace
Analysis aligns ranks on their first collective).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP_LABEL = "distlab:step"  # the record_function range around each profiled step
BACKWARD_LABEL = "distlab:backward"  # ... and around each backward pass inside it
COMM_PREFIXES = ("gloo:", "nccl:", "nccldevkernel", "ncclkernel")
NOT_COMPUTE = ("c10d::", "record_param_comms", "ProfilerStep", "PythonDispatchMode", STEP_LABEL,
               BACKWARD_LABEL)


@dataclass(frozen=True)
class Span:
    """One interval of work on one row of one rank, in seconds on the trace's clock."""

    rank: int
    row: str
    name: str
    start: float
    end: float
    kind: str  # "compute", "comm", "step" or "backward" (a `distlab:backward` range)


def is_comm(name: str) -> bool:
    """Whether an event's name is a collective's work (gloo range or NCCL kernel)."""
    return name.lower().startswith(COMM_PREFIXES)


def _main_thread(events: Sequence[Mapping[str, Any]]) -> Any:
    ops = Counter(e.get("tid") for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    if not ops:
        raise ValueError("the trace has no cpu_op events: profile with ProfilerActivity.CPU")
    return ops.most_common(1)[0][0]


def _holders(events: Sequence[Mapping[str, Any]], main: Any) -> set[int]:
    """The ids of the main thread's operators that hold a collective (a `c10d::` operator) inside them:
    a blocking collective waits inside them, so they are not computation (their other operators are)."""
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("tid") == main),
                 key=lambda e: (float(e["ts"]), -float(e["dur"])))
    stack: list[Mapping[str, Any]] = []
    holders: set[int] = set()
    for e in ops:
        while stack and float(stack[-1]["ts"]) + float(stack[-1]["dur"]) <= float(e["ts"]):
            stack.pop()
        if str(e.get("name", "")).startswith("c10d::"):
            holders.update(id(outer) for outer in stack)
        stack.append(e)
    return holders


def _kind(e: Mapping[str, Any], main: Any, gpu: bool) -> str | None:
    name, cat = str(e.get("name", "")), e.get("cat")
    if name in (STEP_LABEL, BACKWARD_LABEL) and e.get("tid") == main:
        return "step" if name == STEP_LABEL else "backward"
    if is_comm(name):
        return "comm"
    if name.startswith(NOT_COMPUTE):
        return None
    if gpu:
        return "compute" if cat == "kernel" else None
    return "compute" if cat == "cpu_op" and e.get("tid") == main else None


def spans(trace: Mapping[str, Any], rank: int) -> list[Span]:
    """The compute, communication, step and backward spans of one rank's Chrome trace (the dict
    `json.load` gives).

    Rows: "main" (the thread that runs the operators), "thread N" for other threads (gloo's workers),
    "stream N" for GPU streams."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    if not events:
        raise ValueError("the trace has no complete ('X') events; pass a torch.profiler Chrome trace")
    main = _main_thread(events)
    gpu = any(e.get("cat") == "kernel" for e in events)
    holders = set() if gpu else _holders(events, main)
    names: dict[Any, str] = {}
    out = []
    for e in events:
        kind = _kind(e, main, gpu)
        if kind is None or (kind == "compute" and id(e) in holders):
            continue
        start = float(e["ts"]) * 1e-6
        out.append(Span(rank, _row(names, e, main), str(e["name"]), start, start + float(e["dur"]) * 1e-6,
                        kind))
    return out


def _row(names: dict[Any, str], e: Mapping[str, Any], main: Any) -> str:
    """The row of event `e`: "main", "stream N" or "thread N" (numbered in order of first appearance,
    noted in `names`, thread id -> row)."""
    tid = e.get("tid")
    if tid not in names:
        others = sum(1 for n in names.values() if n.startswith("thread"))
        names[tid] = "main" if tid == main else \
            (f"stream {tid}" if e.get("cat") == "kernel" else f"thread {others + 1}")
    return names[tid]


def merge(traces: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """One Chrome trace of every rank's: pid = rank (named "rank r"), the threads and streams as rows."""
    merged: list[dict[str, Any]] = []
    for rank, trace in sorted(traces.items()):
        merged += [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                    "args": {"name": f"rank {rank}"}},
                   {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}}]
        for e in trace.get("traceEvents", []):
            if not isinstance(e, dict) or e.get("ph") not in ("X", "M", "i") or \
                    (e.get("ph") == "M" and e.get("name", "").startswith("process_")):
                continue
            if e.get("ph") == "X" and "dur" not in e:
                continue
            merged.append({**e, "pid": rank})
    return {"traceEvents": merged, "displayTimeUnit": "ms"}


def merge_files(paths: Mapping[int, str | Path], out: str | Path) -> Path:
    """Merge the rank traces at `paths` ({rank: file}) into the file `out`; return its path."""
    traces = {r: json.loads(Path(p).read_text(encoding="utf-8")) for r, p in paths.items()}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merge(traces)), encoding="utf-8")
    return out


def split(merged: Mapping[str, Any]) -> dict[int, list[Span]]:
    """The spans of each rank of a merged trace (`merge`), by rank."""
    by_pid: dict[int, list[Any]] = {}
    for e in merged.get("traceEvents", []):
        if isinstance(e.get("pid"), int):
            by_pid.setdefault(e["pid"], []).append(e)
    return {r: spans({"traceEvents": ev}, r) for r, ev in sorted(by_pid.items())}
