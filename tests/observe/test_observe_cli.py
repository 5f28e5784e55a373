"""`python -m distlab.observe`, as a person runs it: planted hangs named, a slowed rank found, bad sizes
refused with the fix."""

from __future__ import annotations

import json
import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distlab.observe", *args], capture_output=True, text=True,
                          timeout=180)


def test_hang_names_every_planted_rank_and_collective() -> None:
    done = _run("hang", "--plantings", "2", "--seed", "3", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["plantings"]) == 2 and all(p["hit"] for p in report["plantings"])
    for p in report["plantings"]:
        named_seq = int(p["diagnosis"].split("#")[1].split(":")[0])
        assert f"rank {p['planted']['rank']} " in p["diagnosis"] and named_seq == p["seq"]


def test_straggler_names_the_slowed_rank() -> None:
    done = _run("straggler", "--world-size", "3", "--slow-rank", "1", "--steps", "4")
    assert done.returncode == 0, done.stderr
    assert "straggler: rank 1" in done.stdout


def test_two_ranks_are_refused_with_the_reason() -> None:
    done = _run("hang", "--world-size", "2")
    assert done.returncode == 2 and "at least 3 ranks" in done.stderr
