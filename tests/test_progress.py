"""The student's progress is the student's: a lab run from a copy that holds the worked solutions (the
instructor's labs/, under nbval or in JupyterLab) never writes ~/.distlab/progress.json, while the same
check in a student copy does (issue 38, D4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from distlab import progress
from distlab.pipeline.schedules import one_f_one_b_order
from distlab.student import write_student_labs

CHECK = """from distlab.pipeline.exercises import check_one_f_one_b
from distlab.pipeline.schedules import one_f_one_b_order

def my_order(p, m):
    # BEGIN SOLUTION
    return one_f_one_b_order(p, m)
    # END SOLUTION

check_one_f_one_b(my_order, run=False)"""
SHOW = 'from distlab import progress\nprogress.show("04")'


def _lab(folder: Path, *sources: str) -> Path:
    """A tiny lab named like lab 04 (so its checks count there), one code cell per source."""
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": s} for i, s in enumerate(sources)]
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    folder.mkdir(parents=True, exist_ok=True)
    lab = folder / "04_pipeline.ipynb"
    lab.write_text(json.dumps(nb))
    return lab


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh home folder, DISTLAB_PROGRESS unset: the student's default record is home/.distlab/."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.delenv(progress.SESSION, raising=False)
    return tmp_path / "home"


def _record_pass() -> None:
    from distlab.pipeline.exercises import check_one_f_one_b
    assert check_one_f_one_b(lambda p, m: one_f_one_b_order(p, m), run=False)


def test_a_lab_with_its_solutions_never_writes_the_students_record(home, tmp_path, monkeypatch) -> None:
    instructor = _lab(tmp_path / "labs", CHECK)
    monkeypatch.chdir(instructor.parent)  # where nbval and nbconvert start the kernel
    assert progress.solutions_lab() == instructor
    _record_pass()
    student_file = home / ".distlab" / "progress.json"
    assert not student_file.exists(), "a lab with the worked solutions wrote the student's progress"
    assert "check_one_f_one_b  pass" in progress.report("04"), "the kernel's own run still shows"
    assert "never as your progress" in progress.report()
    assert "check_one_f_one_b  not run yet" in progress.report("04", path=progress.progress_path())
    # The student's copy of the same lab (solutions stubbed) is the student's: the check records there.
    write_student_labs([instructor], tmp_path / "mylabs")
    monkeypatch.chdir(tmp_path / "mylabs")
    assert progress.solutions_lab() is None
    _record_pass()
    assert json.loads(student_file.read_text()) == {"check_one_f_one_b": "pass"}


def test_jupyterlab_names_the_notebook_and_that_decides(home, tmp_path, monkeypatch) -> None:
    """In JupyterLab the kernel knows its notebook (JPY_SESSION_NAME): a student copy records even when
    the working folder also holds an instructor's lab, and an instructor's lab never does."""
    instructor = _lab(tmp_path / "labs", CHECK)
    write_student_labs([instructor], tmp_path / "mylabs")
    monkeypatch.chdir(instructor.parent)
    monkeypatch.setenv(progress.SESSION, str(tmp_path / "mylabs" / instructor.name))
    assert progress.recording_path() == home / ".distlab" / "progress.json"
    monkeypatch.setenv(progress.SESSION, str(instructor))
    assert progress.recording_path() != home / ".distlab" / "progress.json"


def test_an_explicit_file_or_off_is_obeyed_everywhere(tmp_path, monkeypatch) -> None:
    """`make test` points DISTLAB_PROGRESS at a temporary file: the labs' solutions record there."""
    monkeypatch.chdir(_lab(tmp_path / "labs", CHECK).parent)
    monkeypatch.setenv(progress.ENV, str(tmp_path / "p.json"))
    assert progress.recording_path() == tmp_path / "p.json"
    monkeypatch.setenv(progress.ENV, "off")
    assert progress.recording_path() is None


def test_markdown_that_mentions_the_marker_is_not_a_solution(tmp_path) -> None:
    lab = _lab(tmp_path, "x = 1")
    nb = json.loads(lab.read_text())
    nb["cells"].append({"cell_type": "markdown", "id": "m", "metadata": {},
                        "source": "Solutions sit between\n# BEGIN SOLUTION\nand its end."})
    lab.write_text(json.dumps(nb))
    assert not progress.holds_solutions(lab)
    assert not progress.holds_solutions(tmp_path / "missing.ipynb")


def test_the_contributing_command_on_a_lab_with_solutions_leaves_the_students_record(home, tmp_path) -> None:
    """The real path: CONTRIBUTING's per-lab command (pytest --nbval) runs a lab holding its solution in a
    kernel with DISTLAB_PROGRESS unset; the student's ~/.distlab/progress.json stays as it was. The same
    notebook as a student copy, its stub filled in by the student, records."""
    instructor = _lab(tmp_path / "labs", CHECK, SHOW)
    env = {**os.environ, "HOME": str(home)}
    env.pop(progress.ENV, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(progress.__file__).parents[1]),
                                                       env.get("PYTHONPATH")]))

    def nbval(lab: Path) -> None:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                              "--nbval-current-env", str(lab)], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=240)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    def kernel_files() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob("distlab-progress-instructor-*.json"))

    before = kernel_files()
    nbval(instructor)
    student_file = home / ".distlab" / "progress.json"
    assert not student_file.exists(), "running a lab from labs/ under nbval wrote the student's progress"
    first = kernel_files() - before
    nbval(instructor)  # a killed kernel runs no atexit: the next one sweeps its file away
    assert not first & kernel_files(), f"a gone kernel's own record is still there: {first}"
    write_student_labs([instructor], tmp_path / "mylabs")
    copy = tmp_path / "mylabs" / instructor.name
    mine = "return one_f_one_b_order(p, m)  #("  # the student's own answer, where the stub was
    copy.write_text(copy.read_text().replace("raise NotImplementedError(", mine))
    nbval(copy)
    assert json.loads(student_file.read_text()) == {"check_one_f_one_b": "pass"}
