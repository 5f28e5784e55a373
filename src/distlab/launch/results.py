"""What a run hands back: every rank's output, printed by rank, and every rank's result.

A rank's stdout and stderr went to rankR.out in the launch's folder, and its return value, pickled, to
rankR.result (`worker.py`). After the run the launcher prints the output grouped by rank, as a terminal
would have shown each line, and reads the results in rank order; a rank allowed to fail (`may_fail`) that
failed or was still running gets its `RankError` (`diagnosis`) in its slot.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import cloudpickle

from distlab.launch import diagnosis
from distlab.launch.rank_state import RankState


def visible(line: str) -> str:
    """What a terminal shows of one line of output: the text after its last carriage return (a progress
    bar's last state), where a line that ends in "\\r\\n" (Windows' line end) keeps its text."""
    return line.rstrip("\r").rsplit("\r", 1)[-1]


def print_output(d: Path, world_size: int) -> None:
    """Print what each rank wrote to stdout/stderr, grouped by rank, in rank order."""
    for r in range(world_size):
        f = d / f"rank{r}.out"
        text = f.read_bytes().decode(errors="replace") if f.exists() else ""  # keep \r as written
        for line in map(visible, text.split("\n")):
            if line.strip():
                print(f"[rank {r}] {line}")
    sys.stdout.flush()


def collect(states: list[RankState], d: Path, why: str) -> list[Any]:
    """Each rank's result; a rank allowed to fail that failed, or was still running, gets its RankError."""
    return [diagnosis.ended_allowed(s, why) if s.code is None
            else diagnosis.own_error(s) if s.code != 0 or not s.returned
            else cloudpickle.loads((d / f"rank{s.rank}.result").read_bytes()) for s in states]
