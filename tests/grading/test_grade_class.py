"""A synthetic class, graded in one command: every verdict right, in bounded time, the repository untouched.

The class is made here from the course's labs: the worked solutions, the stubs as `make student` writes
them, wrong solutions of the kinds the checks name (a rule off by one, a solution tuned to the public cases
that the hidden cases catch), a cell that is not valid Python, one that loops forever, one that prints
forever, one that ends the grading process, one that kills its ranks, and two that write into the
repository (one from the grading process, one from a rank; both catch the error). To stay near a minute on
two cores it uses the cheap labs (03, 10, 11) for most kinds and lab 01 for the ranks, and a short timeout
for the hang.
"""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import time
from pathlib import Path

from distlab.grading import registry
from distlab.grading.grade import grade_main
from distlab.student import student_notebook

ROOT = Path(__file__).resolve().parents[2]
LABS = ROOT / "labs"
TIMEOUT = 25  # seconds an exercise may run here (the hang costs this once)
PLANTED = {"repo": "GRADED_BY_A_STUDENT.txt", "rank": "GRADED_BY_A_RANK.txt"}

WRONG_MAY_START = """
def my_may_start(clock, clocks, staleness):
    return clock - min(clocks) < staleness
"""
TUNED_CHUNKS = """
def my_chunks(rank, p):
    return {1: [(0, 1)], 2: [(0, 3), (1, 2)], 3: [(0, 5), (1, 4), (2, 3)],
            4: [(0, 7), (1, 6), (2, 5), (3, 4)]}[p][rank]
"""
BROKEN_MERGE = """
def my_merge(out_a, lse_a, out_b, lse_b):
    return out_a +
"""
HANG = """
def my_healing_fraction(mtbf, step_s, detect, heal, replicas, replace):
    while True:
        pass
"""
PRINTS_FOREVER = """
def my_outer_step(theta, thetas, buffer, lr, mu):
    while True:
        print("still thinking")
"""
KILLS_THE_GRADER = """
def my_may_start(clock, clocks, staleness):
    import os
    os._exit(7)
"""
KILLS_ITS_RANK = """
import torch

def my_ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    import os
    os._exit(3)
"""
WRITES_FROM_A_RANK = f"""
def my_two_level_all_reduce(tensor, node, across):
    try:
        open({str(ROOT / PLANTED["rank"])!r}, "w").write("mine")
    except PermissionError:
        pass
    return tensor
"""
WRITES_INTO_THE_REPO = f"""
def my_may_start(clock, clocks, staleness):
    try:
        with open({str(ROOT / PLANTED["repo"])!r}, "w") as f:
            f.write("mine")
    except PermissionError:
        pass
    return clock - min(clocks) <= staleness
"""


def _plant(lab: str, function: str, source: str, nb: dict | None = None) -> dict:
    """Lab `lab` (the course's copy, or `nb`) with the cell that defines `function` replaced by `source`."""
    nb = nb or json.loads((LABS / f"{lab}.ipynb").read_text())
    cell = next(c for c in nb["cells"]
                if c["cell_type"] == "code" and f"def {function}(" in "".join(c["source"]))
    cell["source"] = source
    return nb


def _lab(lab: str) -> dict:
    return json.loads((LABS / f"{lab}.ipynb").read_text())


def _stub(lab: str) -> dict:
    return student_notebook(_lab(lab), name=lab)[0]


CLASS = {
    "solutions": {"03_async_sgd": _lab, "10_context_parallel": _lab},
    "stubs": {"03_async_sgd": _stub, "10_context_parallel": _stub},
    "wrong": {"03_async_sgd": lambda lab: _plant(lab, "my_may_start", WRONG_MAY_START),
              "10_context_parallel": lambda lab: _plant(lab, "my_merge", BROKEN_MERGE,
                                                        _plant(lab, "my_chunks", TUNED_CHUNKS))},
    "hangs": {"03_async_sgd": lambda lab: _plant(lab, "my_may_start", KILLS_THE_GRADER),
              "11_fault_tolerance": lambda lab: _plant(lab, "my_outer_step", PRINTS_FOREVER,
                                                       _plant(lab, "my_healing_fraction", HANG))},
    "ranks": {"01_collectives": lambda lab: _plant(lab, "my_two_level_all_reduce", WRITES_FROM_A_RANK,
                                                   _plant(lab, "my_ring_all_reduce", KILLS_ITS_RANK))},
    "writer": {"03_async_sgd": lambda lab: _plant(lab, "my_may_start", WRITES_INTO_THE_REPO)},
}
# (student, exercise) -> (verdict, which cases failed, a fragment of the message); every other exercise
# of the course was not handed in: "not written".
EXPECTED = {
    ("solutions", "check_may_start"): ("pass", "", ""),
    ("solutions", "check_merge"): ("pass", "", ""),
    ("solutions", "check_zigzag_chunks"): ("pass", "", ""),
    ("stubs", "check_may_start"): ("not written", "", ""),
    ("stubs", "check_merge"): ("not written", "", ""),
    ("stubs", "check_zigzag_chunks"): ("not written", "", ""),
    ("wrong", "check_may_start"): ("fail", "public+hidden", "<="),
    ("wrong", "check_merge"): ("crashed", "", "not valid Python"),
    ("wrong", "check_zigzag_chunks"): ("fail", "hidden", "p = 5"),
    ("hangs", "check_may_start"): ("crashed", "", "the process ended (exit code 7)"),
    ("hangs", "check_healing_fraction"): ("timed out", "", f"after {TIMEOUT} s"),
    ("hangs", "check_outer_step"): ("crashed", "", "printed more than"),
    ("ranks", "check_ring_all_reduce"): ("crashed", "public+hidden", "rank"),
    ("ranks", "check_two_level_all_reduce"): ("forbidden write", "public+hidden", PLANTED["rank"]),
    ("writer", "check_may_start"): ("forbidden write", "", PLANTED["repo"]),
}


def _repository_state() -> tuple[str, str]:
    """What git sees changed, and a hash of every tracked file's bytes."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    digest = hashlib.sha256()
    for name in filter(None, files.split(b"\0")):
        path = ROOT / name.decode()
        digest.update(name + (path.read_bytes() if path.is_file() else b""))
    return status, digest.hexdigest()


def test_a_synthetic_class_gets_the_right_verdict_for_every_student_and_exercise(tmp_path):
    submissions = tmp_path / "submissions"
    for student, labs in CLASS.items():
        (submissions / student).mkdir(parents=True)
        for lab, make in labs.items():
            (submissions / student / f"{lab}.ipynb").write_text(json.dumps(make(lab)))
    before = _repository_state()
    started = time.monotonic()
    assert grade_main([str(submissions), "--out", str(tmp_path / "out"), "--timeout", str(TIMEOUT),
                       "--jobs", "2"]) == 0
    seconds = time.monotonic() - started
    rows = list(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    exercises = registry.exercises()
    assert len(rows) == len(CLASS) * len(exercises)
    wrong = []
    for row in rows:
        want = EXPECTED.get((row["student"], row["exercise"]), ("not written", "", ""))
        got = (row["verdict"], row["failed"], row["message"])
        if got[:2] != want[:2] or want[2] not in got[2]:
            wrong.append(f"{row['student']} {row['exercise']}: got {got}, expected {want}")
    assert not wrong, "\n".join(wrong)
    assert seconds < 150, f"grading the synthetic class took {seconds:.0f} s"
    assert _repository_state() == before, "grading changed the repository"
    assert not any((ROOT / name).exists() for name in PLANTED.values())
    page = (tmp_path / "out" / "grades.html").read_text()
    assert "<script" not in page and "http" not in page and "forbidden write" in page
    assert json.loads((tmp_path / "out" / "grades.json").read_text())[0].keys() == rows[0].keys()
