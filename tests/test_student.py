"""Student versions of the labs: solutions become stubs, outputs go, nothing else changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distlab.student import BEGIN, STUB, strip_solutions, student_notebook

LABS = sorted(Path(__file__).resolve().parents[1].glob("labs/[0-9][0-9]_*.ipynb"))

SOLVED = """\
import torch

def my_fn(tensor):
    n = tensor.numel()
    # BEGIN SOLUTION
    secret = n * 2
    return secret
    # END SOLUTION

def other():
        # BEGIN SOLUTION
        return 42
        # END SOLUTION
"""


def test_regions_become_indented_stubs():
    text, count = strip_solutions(SOLVED)
    assert count == 2
    assert "secret" not in text and "42" not in text
    assert f"    n = tensor.numel()\n    {STUB}\n" in text
    assert f"def other():\n        {STUB}\n" in text
    compile(text, "student", "exec")  # still valid Python


def test_stubbed_function_raises_not_implemented():
    namespace: dict = {}
    exec(strip_solutions(SOLVED)[0], namespace)
    with pytest.raises(NotImplementedError, match="Your turn"):
        namespace["my_fn"](__import__("torch").zeros(3))


@pytest.mark.parametrize("source, message", [
    ("# BEGIN SOLUTION\nx = 1\n", "line 1: '# BEGIN SOLUTION' is never closed"),
    ("x = 1\n# END SOLUTION\n", "line 2: '# END SOLUTION' without a matching '# BEGIN SOLUTION'"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n", "line 2: '# BEGIN SOLUTION' inside another solution"),
])
def test_unbalanced_markers_are_reported_with_line(source, message):
    with pytest.raises(ValueError, match=message):
        strip_solutions(source, where="lab.ipynb, cell 3")


def test_notebook_outputs_cleared_and_markdown_kept():
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Title\n", "# BEGIN SOLUTION stays in prose"]},
        {"cell_type": "code", "metadata": {}, "execution_count": 3, "source": SOLVED,
         "outputs": [{"output_type": "stream", "name": "stdout", "text": "84\n"}]},
    ]}
    student, count = student_notebook(nb)
    assert count == 2
    assert student["cells"][0] == nb["cells"][0]
    assert student["cells"][1]["outputs"] == [] and student["cells"][1]["execution_count"] is None
    assert nb["cells"][1]["outputs"], "the instructor's notebook must not be modified"


@pytest.mark.parametrize("lab", LABS, ids=[p.name for p in LABS])
def test_every_lab_has_a_clean_student_version(lab, tmp_path):
    out = subprocess.run([sys.executable, "-m", "distlab.student", str(lab), "--out", str(tmp_path)],
                         capture_output=True, text=True, check=True)
    assert "solution(s) replaced by stubs" in out.stdout
    student = json.loads((tmp_path / lab.name).read_text())
    code = ["".join(c["source"]) for c in student["cells"] if c["cell_type"] == "code"]
    assert not any("# BEGIN SOLUTION" in c or "# END SOLUTION" in c for c in code)
    assert all(c.get("outputs", []) == [] for c in student["cells"])


@pytest.mark.parametrize("lab", LABS, ids=[p.name for p in LABS])
def test_solution_cells_are_collapsed_in_the_book(lab):
    cells = json.loads(lab.read_text())["cells"]
    solved = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and BEGIN in "".join(c["source"])]
    assert solved, f"{lab.name} has no exercise with a worked solution"
    unhidden = [i for i in solved if "hide-input" not in cells[i]["metadata"].get("tags", [])]
    assert not unhidden, f"{lab.name}: cells {unhidden} hold a solution but lack the 'hide-input' tag"
