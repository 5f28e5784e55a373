"""What the launcher learns about each rank when it writes a report: one `RankState` per rank.

A rank leaves its traces in the run's folder (`worker.py`): `rankR.stack` once it answers SIGUSR1 with
its stacks, `rankR.joining` when it goes to init_process_group, `rankR.started` when its function
starts, then `rankR.result` or `rankR.error`; `rankR.fatal` holds faulthandler's dump of a fatal signal,
`rankR.children` the processes it left running, `rankR.out` its output. A rank still running is asked
for its stack.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

from distlab.launch import sources
from distlab.launch.rank_state import RankState


def stacks(procs: list[subprocess.Popen], d: Path) -> dict[int, list[sources.Frame]]:
    """Ask the ranks still running where they are (faulthandler on SIGUSR1) and parse their stacks."""
    live = [r for r, p in enumerate(procs) if p.poll() is None and (d / f"rank{r}.stack").exists()]
    if not live:
        return {}
    for r in live:
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and not all(
            "_worker_main" in (d / f"rank{r}.stack").read_text(errors="replace") for r in live):
        time.sleep(0.02)
    time.sleep(0.05)  # the rest of the dump (the other threads)
    return {r: sources.parse_dump((d / f"rank{r}.stack").read_text(errors="replace")) for r in live}


def native_message(d: Path, rank: int) -> str:
    """What native code said as it aborted the rank (C++'s `terminate called ...`, then `what(): ...`)."""
    f = d / f"rank{rank}.out"
    lines = f.read_bytes().decode(errors="replace").splitlines() if f.exists() else []
    said = [line.split("what():", 1)[1].strip() for line in lines if "what():" in line]
    return said[-1] if said else ""


def fatal_stack(d: Path, rank: int) -> tuple[list[sources.Frame], float | None]:
    """Where a rank was when a fatal signal (SIGSEGV, SIGABRT...) ended it, and when (faulthandler)."""
    f = d / f"rank{rank}.fatal"
    if not f.exists() or f.stat().st_size == 0:
        return [], None
    return sources.parse_dump(f.read_text(errors="replace")), f.stat().st_mtime


def state(r: int, p: subprocess.Popen, d: Path, allowed: Collection[int], seen: dict[int, float],
           frames: list[sources.Frame], code_sources: dict[str, dict]) -> RankState:
    s = RankState(r, p.poll(), allowed=r in allowed, started=(d / f"rank{r}.started").exists(),
                  joined=(d / f"rank{r}.joining").exists(), frames=frames, sources=code_sources)
    s.returned = (d / f"rank{r}.result").exists()
    if (d / f"rank{r}.error").exists():
        s.error = json.loads((d / f"rank{r}.error").read_text())
    fatal, died_at = fatal_stack(d, r)
    if s.died:
        s.frames, s.said = fatal, native_message(d, r)
    s.at = (s.error["time"] if s.error else (d / f"rank{r}.result").stat().st_mtime if s.returned
            else min(died_at or math.inf, seen.get(r, math.inf)) if s.code is not None else 0.0)
    return s


def states(procs: list[subprocess.Popen], d: Path, allowed: Collection[int], seen: dict[int, float],
            code_sources: dict[str, dict]) -> list[RankState]:
    """What is known of every rank now; the ranks still running are asked for their stacks."""
    frames = stacks(procs, d)
    starts = [f.stat().st_mtime for f in d.glob("rank*.started")]
    t0 = min(starts) if starts else None
    states = []
    for r, p in enumerate(procs):
        s = state(r, p, d, allowed, seen, frames.get(r, []), code_sources)
        s.ended = s.at - t0 if t0 is not None and s.code is not None else None
        states.append(s)
    return states


def noted(d: Path) -> list[tuple[int, int]]:
    """The processes the ranks that exited noted as still running (see `cleanup.descendants`)."""
    found = []
    for f in d.glob("rank*.children"):
        found += [(int(a), int(b)) for a, b in (line.split() for line in f.read_text().splitlines())]
    return found
