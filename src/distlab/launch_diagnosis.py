"""Why a launch failed: find the rank whose failure caused the others' and say where the rest were.

When one rank fails, its peers usually fail a moment later with "connection reset by peer" or a
timeout: symptoms, not the cause. `_failure` reads every rank's error report, picks the root cause,
recognises a deadlock (every rank timed out waiting), and asks the ranks still running for their Python
stacks (faulthandler on SIGUSR1, `_stacks_of`). The result is one `RankError` carrying the culprit's own
traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

# Messages that a rank prints when a *peer* went away: a symptom, not the cause.
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed",
              "ecconnreset", "econnreset", "connection refused")


class RankError(RuntimeError):
    """A rank failed. `rank` is the rank that failed first; `traceback` is that rank's own traceback."""

    def __init__(self, message: str, rank: int, traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback


def _stacks_of(procs: list[subprocess.Popen], d: Path, ranks: list[int]) -> str:
    """Ask still-running ranks where they are (faulthandler on SIGUSR1) and return the stacks."""
    for r in ranks:
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(0.3)
    parts = []
    for r in ranks:
        text = (d / f"rank{r}.stack").read_text(errors="replace").strip()
        parts.append(f"--- where rank {r} was ---\n{text or '(no Python stack)'}")
    return "\n".join(parts)


def _own_error(d: Path, r: int, code: int) -> RankError:
    """Rank r's failure on its own, for a rank that `run(may_fail=...)` allows to fail."""
    f = d / f"rank{r}.error"
    if f.exists():
        e = json.loads(f.read_text())
        return RankError(f"rank {r} failed with {e['type']}: {e['message']}", r, e["traceback"])
    return RankError(f"rank {r} exited with code {code} without raising a Python exception", r)


def _failure(procs: list[subprocess.Popen], d: Path, world_size: int, timeout: float,
             allowed: Collection[int] = ()) -> RankError:
    """Build the error for a failed run: pick the rank whose failure caused the others'."""
    time.sleep(0.2)  # let ranks failing at the same moment finish writing their reports
    errors = {}
    for r in range(world_size):
        f = d / f"rank{r}.error"
        if f.exists() and r not in allowed:
            errors[r] = json.loads(f.read_text())
    exited = {r: p.returncode for r, p in enumerate(procs)
              if p.poll() is not None and p.returncode != 0 and r not in allowed}
    running = [r for r, p in enumerate(procs) if p.poll() is None]

    def symptom(e: dict) -> bool:
        return any(s in e["message"].lower() for s in _PEER_GONE)

    def is_timeout(e: dict) -> bool:
        return "timed out" in e["message"].lower() or "timeout" in e["type"].lower()

    if errors:
        root = min(errors, key=lambda r: (symptom(errors[r]), errors[r]["time"]))
        e = errors[root]
        timed_out = is_timeout(e)
        msg = f"rank {root} failed with {e['type']}: {e['message']}"
        if timed_out:
            msg = (f"rank {root} timed out: it waited more than {timeout:g} s for a message from another "
                   f"rank (run(timeout=...) sets this limit). {e['type']}: {e['message']}")
            if running:
                msg += f"\nRanks still running then: {running}.\n" + _stacks_of(procs, d, running)
        others = sorted(set(errors) - {root})
        if timed_out and not running and all(is_timeout(errors[r]) for r in others):
            msg += ("\nEvery rank timed out waiting: a deadlock. Each rank waits for a message that no "
                    "rank sends; check that every send or collective has a matching recv or collective "
                    "on its peers.")
        elif others:
            msg += f"\n(ranks {others} failed too, afterwards; their errors follow from rank {root}'s)"
        return RankError(f"{msg}\n\n--- traceback of rank {root} ---\n{e['traceback']}", root, e["traceback"])
    root = min(exited)
    code = exited[root]
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return RankError(f"rank {root} {how} without raising a Python exception (a crash, os._exit, or the "
                     "out-of-memory killer); see its output above", root)

