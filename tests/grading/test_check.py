"""`distlab check`: a student's public cases of the whole course in one command, the grader's engine.

A solution tuned to the public cases passes here and fails `distlab grade` (tests/grading/test_grade_class.py
shows the hidden side); the table says which exercises are not written yet.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from distlab.cli import main
from tests.grading.test_grade_class import TUNED_CHUNKS, _plant


def test_check_runs_the_public_cases_only_and_prints_a_short_table(tmp_path, capsys):
    mylabs = tmp_path / "mylabs"
    mylabs.mkdir()
    lab = "10_context_parallel"
    (mylabs / f"{lab}.ipynb").write_text(json.dumps(_plant(lab, "my_chunks", TUNED_CHUNKS)))
    assert main(["check", str(mylabs), "--lab", "10", "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "10  check_merge          pass" in out and "10  check_zigzag_chunks  pass" in out
    assert "2 of 2 exercises pass their public cases" in out
    assert main(["check", str(mylabs), "--lab", "03"]) == 1  # no lab 03 here: not written, no process
    assert "check_may_start  not written: no notebook handed in" in capsys.readouterr().out


def test_make_grade_and_make_check_run_the_two_commands():
    root = Path(__file__).resolve().parents[2]
    dry = subprocess.run(["make", "-n", "grade", "check", "SUBMISSIONS=class", "GRADES=out", "MYLABS=mine"],
                         cwd=root, capture_output=True, text=True, check=True).stdout
    assert "/distlab grade class --out out --timeout 120" in dry and "/distlab check mine" in dry
    helps = subprocess.run(["make", "help"], cwd=root, capture_output=True, text=True, check=True).stdout
    assert "make grade" in helps and "submissions/" in helps and "make check" in helps
