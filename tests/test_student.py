"""Student versions of the labs: solutions become stubs, what a run leaves behind goes (outputs, execution
metadata, widget state), nothing else changes. Also what a student's `make lab` sets up: the Jupyter kernel
lives inside this clone's .venv."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distlab.student import BEGIN, STUB, strip_solutions, student_notebook

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(ROOT.glob("labs/[0-9][0-9]_*.ipynb"))
# Every chapter's lab ends with exercises; 00_when_a_run_fails is a reading lab beside the introduction
# (three failure reports and how to read them), with nothing to write.
EXERCISE_LABS = [lab for lab in LABS if not lab.name.startswith("00_")]

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


def test_run_metadata_and_widget_state_are_stripped_and_tags_kept():
    run = {"execution": {"iopub.execute_input": "2025-01-01T00:00:00"}, "ExecuteTime": {"end_time": "x"},
           "collapsed": False, "scrolled": True, "tags": ["hide-input"]}
    nb = {"nbformat": 4, "nbformat_minor": 5, "cells": [
        {"cell_type": "code", "metadata": dict(run), "execution_count": 7, "source": SOLVED, "outputs": []},
        {"cell_type": "markdown", "metadata": {"ExecuteTime": {}}, "source": "text"}],
        "metadata": {"kernelspec": {"name": "python3"}, "signature": "sha256:00",
                     "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}}}}
    student, _ = student_notebook(nb)
    assert student["metadata"] == {"kernelspec": {"name": "python3"}}
    assert student["cells"][0]["metadata"] == {"tags": ["hide-input"]}
    assert student["cells"][1]["metadata"] == {}
    assert nb["metadata"]["widgets"] and nb["cells"][0]["metadata"]["execution"], "input must stay as it was"


@pytest.mark.parametrize("lab", LABS, ids=[p.name for p in LABS])
def test_every_lab_has_a_clean_student_version(lab, tmp_path):
    out = subprocess.run([sys.executable, "-m", "distlab.student", str(lab), "--out", str(tmp_path)],
                         capture_output=True, text=True, check=True)
    assert "solution(s) replaced by stubs" in out.stdout
    student = json.loads((tmp_path / lab.name).read_text())
    code = ["".join(c["source"]) for c in student["cells"] if c["cell_type"] == "code"]
    assert not any("# BEGIN SOLUTION" in c or "# END SOLUTION" in c for c in code)
    assert all(c.get("outputs", []) == [] for c in student["cells"])
    assert all(c.get("execution_count") is None for c in student["cells"] if c["cell_type"] == "code")
    assert "widgets" not in student["metadata"], "the student version must not carry the widget state"
    assert not any("execution" in c["metadata"] for c in student["cells"])


@pytest.mark.parametrize("lab", EXERCISE_LABS, ids=[p.name for p in EXERCISE_LABS])
def test_solution_cells_are_collapsed_in_the_book(lab):
    cells = json.loads(lab.read_text())["cells"]
    solved = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and BEGIN in "".join(c["source"])]
    assert solved, f"{lab.name} has no exercise with a worked solution"
    unhidden = [i for i in solved if "hide-input" not in cells[i]["metadata"].get("tags", [])]
    assert not unhidden, f"{lab.name}: cells {unhidden} hold a solution but lack the 'hide-input' tag"


def test_make_lab_installs_the_kernel_inside_this_clones_venv(tmp_path):
    """`make kernel` (run by `make lab`) must not write a user-wide kernel: a second clone would silently
    redirect every clone's notebooks to its own .venv. It installs into the venv (--sys-prefix) instead."""
    dry = subprocess.run(["make", "-n", "kernel"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    [line] = [ln for ln in dry.splitlines() if "ipykernel install" in ln]
    args = shlex.split(line)
    assert "--sys-prefix" in args and "--user" not in args, f"`make kernel` runs {line!r}"
    assert args[args.index("--name") + 1] == "distlab"
    # The same command, into a scratch prefix instead of the venv: the kernel it writes runs this Python.
    args[0] = sys.executable
    args[args.index("--sys-prefix")] = f"--prefix={tmp_path}"
    subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True)
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / "distlab" / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable and spec["display_name"] == "Python (distlab)"


def _make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", *args], cwd=cwd, capture_output=True, text=True)


def test_make_lab_opens_the_students_own_copies_and_never_overwrites_them(tmp_path):
    """`make lab` opens mylabs/ (git-ignored), made once from the student versions; a second `make lab`
    leaves the student's work as it is; `make lab-reset LAB=NN` makes one lab fresh, keeping the old."""
    root, folder = _served("lab", "MYLABS=mine")
    assert (root, folder) == (ROOT, ROOT / "mine"), f"`make lab` opens {folder} in {root}, not the copies"
    assert "mylabs/" in (ROOT / ".gitignore").read_text().split()
    stamp = tmp_path / "installed"  # newer than pyproject.toml: make installs nothing
    stamp.touch()
    mine = tmp_path / "mylabs"
    settings = [f"BIN={Path(sys.executable).parent}", f"STAMP={stamp}", f"MYLABS={mine}"]
    first = _make("mylabs", *settings)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in mine.glob("*.ipynb")) == [lab.name for lab in LABS]
    pipeline = mine / "04_pipeline.ipynb"

    def code() -> str:
        return "".join("".join(c["source"]) for c in json.loads(pipeline.read_text())["cells"])

    assert BEGIN not in code() and STUB in code()
    pipeline.write_text(pipeline.read_text().replace("raise NotImplementedError", "my_work()"))
    work = pipeline.read_text()
    second = _make("mylabs", *settings)
    assert second.returncode == 0 and "kept" in second.stdout, second.stdout + second.stderr
    assert pipeline.read_text() == work, "a second `make lab` overwrote the student's work"
    reset = _make("lab-reset", "LAB=04", *settings)
    assert reset.returncode == 0, reset.stderr
    assert STUB in code() and (mine / "04_pipeline.before-reset.ipynb").read_text() == work
    assert "LAB=04" in _make("lab-reset", *settings).stdout  # no lab named: it says how
    assert _served("lab-instructor") == (ROOT, ROOT / "labs")


def test_every_reset_keeps_its_own_backup(tmp_path):
    """`make lab-reset LAB=04` twice (issue 38, D5): the second reset keeps the first backup and numbers
    its own; the message names both."""
    stamp = tmp_path / "installed"
    stamp.touch()
    mine = tmp_path / "mylabs"
    settings = [f"BIN={Path(sys.executable).parent}", f"STAMP={stamp}", f"MYLABS={mine}"]
    assert _make("mylabs", *settings).returncode == 0
    pipeline = mine / "04_pipeline.ipynb"
    said = []
    for attempt in ("first try", "second try", "third try"):
        pipeline.write_text(pipeline.read_text().replace("raise NotImplementedError", attempt, 1))
        reset = _make("lab-reset", "LAB=04", *settings)
        assert reset.returncode == 0, reset.stderr
        said.append(reset.stdout)
    backups = ["04_pipeline.before-reset.ipynb", "04_pipeline.before-reset-2.ipynb",
               "04_pipeline.before-reset-3.ipynb"]
    for name, attempt in zip(backups, ("first try", "second try", "third try"), strict=True):
        assert attempt in (mine / name).read_text(), f"{name} does not hold the {attempt}"
    assert "moved to 04_pipeline.before-reset-3.ipynb" in said[2], said[2]
    assert "earlier backups kept: 04_pipeline.before-reset-2.ipynb, 04_pipeline.before-reset.ipynb" in said[2]


def _served(target: str, *settings: str) -> tuple[Path, Path]:
    """The folder JupyterLab serves (root_dir) and the one it opens (default_url), for `make -n target`."""
    dry = subprocess.run(["make", "-n", target, *settings], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    [line] = [ln for ln in dry.splitlines() if "jupyter lab" in ln]
    options = dict(a.split("=", 1) for a in shlex.split(line) if a.startswith("--") and "=" in a)
    root = Path(options["--ServerApp.root_dir"])
    opened = options["--LabApp.default_url"].removeprefix("/lab/tree/")
    assert options["--LabApp.default_url"] == f"/lab/tree/{opened}", line
    return root, root / opened


def _links(nb: dict) -> list[str]:
    """The relative Markdown links of a notebook (web links and in-page anchors left out)."""
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    links = [m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)", text)]
    return [link for link in links if link and "://" not in link and not link.startswith("mailto:")]


@pytest.mark.parametrize("target", ["lab", "lab-instructor"])
def test_every_lab_link_opens_inside_the_folder_jupyterlab_serves(target):
    """A lab's links to its chapter and to the notation page (`../book/*.md`) open in JupyterLab only when
    they lead to a file inside the folder it serves (issue 38, D1: a root of mylabs/ or labs/ left the book
    outside, and clicking did nothing). The student copies are checked as `make lab` writes them."""
    root, folder = _served(target)
    checked = 0
    for lab in LABS:
        nb = json.loads(lab.read_text())
        if target == "lab":
            book = Path(os.path.relpath(ROOT / "book", folder)).as_posix()
            nb = student_notebook(nb, name=lab.name, book=book)[0]
        for link in _links(nb):
            path = (folder / link).resolve()
            assert path.is_relative_to(root), f"{lab.name}: {link} leads outside {root}"
            assert path.is_file(), f"{lab.name}: {link} leads to {path}, which does not exist"
            checked += 1
    assert checked >= len(LABS), "every lab links to at least the notation page"


def test_a_mylabs_folder_outside_the_clone_is_refused_with_the_fix(tmp_path):
    stamp = tmp_path / "installed"
    stamp.touch()
    run = _make("lab", f"BIN={tmp_path}", f"STAMP={stamp}", f"MYLABS={tmp_path / 'elsewhere'}",
                "-o", "kernel", "-o", "mylabs")  # the check alone: no kernel installed, no copies made
    assert run.returncode != 0 and "is outside this clone" in run.stdout + run.stderr, run.stdout + run.stderr


def test_student_versions_link_to_the_book_from_where_they_are_written(tmp_path):
    """Links `../book/NN-x.md` of a lab still reach the book from _build/student (two folders down)."""
    lab = ROOT / "labs" / "05_tensor_parallel.ipynb"
    out = tmp_path / "a" / "b"
    subprocess.run([sys.executable, "-m", "distlab.student", str(lab), "--out", str(out)], check=True,
                   capture_output=True)
    text = "".join("".join(c["source"]) for c in json.loads((out / lab.name).read_text())["cells"])
    links = re.findall(r"\]\(([^)]*book/[^)#]*)", text)
    assert links and all((out / link).resolve().is_file() for link in links), links


@pytest.mark.skipif(sys.platform != "linux" or shutil.which("nvidia-smi") is not None
                    or Path("/proc/driver/nvidia").exists(), reason="the notice is for Linux without a GPU")
def test_a_linux_machine_without_a_gpu_is_told_what_comes_and_sees_the_download(tmp_path):
    """Before pip fetches torch, `make` says what it does next (which torch, from where, how big on PyPI)
    and how to take the CPU build instead; it only prints (CI, which runs `make test` on such a machine,
    must never wait). Then torch is installed in a step of its own, without --quiet, so the long download
    shows its progress (issue 38, D9: "press Ctrl-C now", then three silent minutes)."""
    notice = _make("--eval", "notice: ; @$(NO_GPU_NOTICE)", "notice", f"BIN={tmp_path}")
    assert notice.returncode == 0
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in notice.stdout, notice.stdout
    assert "Next, pip downloads torch==" in notice.stdout and "press Ctrl-C now" not in notice.stdout
    installed = _make("--eval", "notice: ; @$(NO_GPU_NOTICE)", "notice", f"BIN={Path(sys.executable).parent}")
    assert installed.stdout == "", "torch at the pinned version is there: nothing to download, nothing said"
    rule = subprocess.run(["make", "-n", "env", f"STAMP={tmp_path / 'none'}"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    lines = [ln for ln in rule.splitlines() if "pip install" in ln]
    assert len(lines) == 2 and '"torch==' in lines[0] and "-e " in lines[1], lines
    assert "--quiet" not in lines[0], "the torch download must show its progress"
    assert rule.index("no NVIDIA GPU") < rule.index("pip install"), "the notice must come before pip"
