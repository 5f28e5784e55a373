"""The ranks as processes: start them, notice each exit, and watch them until the run has ended.

A rank is forked by the helper that has imported torch already (`zygote`), or, where forking is off or
the helper does not start, a fresh `python -c` child; either way it leads a session of its own, with
torchrun's environment variables (RANK, WORLD_SIZE, MASTER_ADDR, ...), and writes its output to
rankR.out in the launch's folder. `watch` polls the children every 20 ms and says how the run ended: a
failure, every rank done, a rank stuck after another returned, a rank that never came to
init_process_group, the start-up limit or the deadline (the files the ranks write, `worker.py`, say how
far each has come).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

from distlab.launch import zygote
from distlab.launch.worker import RENDEZVOUS_TIMEOUT

LOADING = 10.0  # seconds a rank may take longer than the others to load its function (imports are slow)


def _environment(r: int, world_size: int, port: int, marker: str) -> dict[str, str]:
    env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world_size), LOCAL_RANK=str(r),
               LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONUNBUFFERED="1", **{marker: "1"})
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return env


def start_ranks(d: Path, world_size: int, port: int, marker: str, helper: zygote.Zygote | None) -> list:
    """Start the ranks: forked by `helper` (`zygote`), or each a fresh `python -c` when there is none.
    Either way a rank leads a session of its own and writes its output to rankR.out."""
    procs: list = []
    for r in range(world_size):
        env, out = _environment(r, world_size, port, marker), d / f"rank{r}.out"
        out.touch()
        if helper is not None:
            procs.append(helper.start(d, r, env, out))
            continue
        with open(out, "w") as f:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", f"from distlab.launch.worker import _worker_main; "
                                       f"_worker_main({str(d)!r}, {r})"],
                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                start_new_session=True))
    return procs


def fork_helper() -> zygote.Zygote | None:
    """The fork helper, where forking is on and the helper starts; None means `python -c` ranks."""
    if not zygote.usable():
        return None
    try:
        return zygote.helper()
    except OSError:
        return None


def wait_for_exit(proc: subprocess.Popen, rank: int, seen: dict[int, float]) -> None:
    """Note when a rank exits, as soon as it does (a thread per rank): a rank that dies must not look
    later than the peers that fail because of it."""
    proc.wait()
    seen.setdefault(rank, time.time())


def _poll(procs: list[subprocess.Popen], seen: dict[int, float]) -> list[int | None]:
    """Every rank's exit status (None: running); `seen` records when each exit was first noticed."""
    codes = [p.poll() for p in procs]
    for r, c in enumerate(codes):
        if c is not None:
            seen.setdefault(r, time.time())
    return codes


def watch(procs: list[subprocess.Popen], d: Path, allowed: Collection[int], grace: float,
          seen: dict[int, float], deadline: float | None) -> str:
    """Wait for the run's end: "done", "failed" (a rank not in may_fail failed, or exited before its
    function returned), "stuck" (a rank was still running `grace` seconds after another returned) or
    "deadline" (the function ran longer than `deadline` seconds) or "start-up" (the ranks had not started
    their function `RENDEZVOUS_TIMEOUT` seconds after the launch)."""
    launched, end = time.monotonic(), None
    while True:
        outcome = _ended(_poll(procs, seen), d, allowed, grace, seen)
        if outcome is not None:
            return outcome
        if end is None and any((d / f"rank{r}.started").exists() for r in range(len(procs))):
            end = time.monotonic() + (deadline if deadline is not None else math.inf)
        outcome = _past_limit(launched, end)
        if outcome is not None:
            return outcome
        time.sleep(0.02)


def _ended(codes: list[int | None], d: Path, allowed: Collection[int], grace: float,
           seen: dict[int, float]) -> str | None:
    """What the ranks' exit statuses say: "failed", "done", "stuck" or "absent"; None while it goes on."""
    if any(_failed(r, c, d, allowed) for r, c in enumerate(codes)):
        return "failed"
    if all(c is not None for c in codes):
        return "done"
    if _stuck(codes, seen, grace):
        return "stuck"
    if _missing(d, len(codes), grace):
        return "absent"
    return None


def _failed(rank: int, code: int | None, d: Path, allowed: Collection[int]) -> bool:
    """Whether rank `rank` (not allowed to die) exited with an error, or exited 0 without a result."""
    return code is not None and rank not in allowed and (code != 0 or not (d / f"rank{rank}.result").exists())


def _stuck(codes: list[int | None], seen: dict[int, float], grace: float) -> bool:
    """Whether a rank returned more than `grace` seconds ago and the others still run."""
    returned = [seen[r] for r, c in enumerate(codes) if c == 0]
    return bool(returned) and time.time() - min(returned) > grace


def _past_limit(launched: float, end: float | None) -> str | None:
    """"start-up" before any rank started its function, "deadline" after; None while within the limit."""
    if end is None and time.monotonic() - launched > RENDEZVOUS_TIMEOUT:
        return "start-up"
    if end is not None and time.monotonic() > end:
        return "deadline"
    return None


def _missing(d: Path, world_size: int, grace: float) -> bool:
    """A rank has not come to init_process_group `grace` seconds (at least `LOADING`) after every other
    rank had, although it had been loading its function that long (see `worker._wait_for_arrivals`)."""
    grace = max(grace, LOADING)
    times = [_mtime(d / f"rank{r}.joining") for r in range(world_size)]
    absent = [r for r, t in enumerate(times) if t is None]
    if not absent or len(absent) == world_size:
        return False
    since = max(t for t in times if t is not None)
    loading = [_mtime(d / f"rank{r}.stack") for r in absent]
    return any(t is not None and time.time() - max(t, since) > grace for t in loading)


def _mtime(f: Path) -> float | None:
    try:
        return f.stat().st_mtime
    except FileNotFoundError:
        return None


def settle(procs: list[subprocess.Popen], seen: dict[int, float], seconds: float) -> None:
    """Wait up to `seconds` for the ranks still running to exit (after a failure, the others fail too)."""
    deadline = time.monotonic() + seconds
    while any(c is None for c in _poll(procs, seen)) and time.monotonic() < deadline:
        time.sleep(0.02)
