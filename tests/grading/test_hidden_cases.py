"""The hidden cases: every exercise has an entry, the worked solutions pass them and the public cases, and
no student copy and no public page contains them.

The worked solutions run through the grader's own steps (`child.namespace`: the lab's setup, then the
solution's definitions; then the lab's check call and the hidden cases), in this process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distlab.grading import child, extract, instructors_page, registry
from distlab.grading.hidden_cases import HIDDEN
from distlab.student import student_notebook

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = registry.exercises()


def _job(ex: registry.Exercise) -> dict:
    code = extract.student_code(ROOT / "labs" / f"{ex.lab}.ipynb", ex.functions)
    assert not code.problem, code.problem
    return {"lab": ex.lab, "check": ex.check, "functions": list(ex.functions), "call": ex.call,
            "context": ex.context, "source": code.source}


def test_every_exercise_of_the_course_has_an_entry_and_no_entry_is_stale():
    assert len(EXERCISES) >= 20, f"the registry found only {[e.key for e in EXERCISES]} in labs/"
    checks = {e.check for e in EXERCISES}
    assert checks == set(HIDDEN), (f"exercises without hidden cases: {sorted(checks - set(HIDDEN))}; "
                                   f"entries for no exercise: {sorted(set(HIDDEN) - checks)}")
    assert all(HIDDEN[c].covers for c in checks)


def test_the_registry_reads_the_labs_check_calls_and_functions():
    by_key = {e.key: e for e in EXERCISES}
    tp = by_key["05_tensor_parallel:check_tensor_parallel"]
    assert set(tp.functions) == {"MyF", "MyG", "my_shard", "my_row_linear"}
    dry = by_key["12_dry_runs:check_tp_bytes"]
    assert dry.call == "check_tp_bytes(my_tp_bytes, lay4, RANK)"
    assert "RANK = 5" in dry.context and "lay4 = from_published(" in dry.context
    assert "check_" not in "".join(line for line in dry.context.splitlines() if "=" in line)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.key)
def test_the_worked_solution_passes_the_public_and_the_hidden_cases(exercise):
    job = _job(exercise)
    names = child.namespace(job)
    public = child.public_result(job, names)
    assert public.passed, str(public)
    hidden = child.hidden_result(job, names)
    assert hidden is not None or HIDDEN[exercise.check].run is None
    assert hidden is None or (hidden.passed and hidden.cases), str(hidden)


def test_student_copies_never_name_the_hidden_cases():
    secrets = ["distlab.grading", "hidden_cases"]
    for lab in sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb")):
        text = json.dumps(student_notebook(json.loads(lab.read_text()), name=lab.name)[0])
        assert not [s for s in secrets if s in text], f"the student copy of {lab.name} names the hidden cases"


def test_only_the_instructor_edition_of_the_instructors_page_lists_the_hidden_cases():
    page = (ROOT / "book" / "instructors.md").read_text()
    assert instructors_page.MARKER in page
    public, instructor = (instructors_page.expand(page, e) for e in ("public", "instructor"))
    for e in EXERCISES:
        assert f"`{e.check}` | {HIDDEN[e.check].covers} |" in instructor
        assert HIDDEN[e.check].covers not in public or HIDDEN[e.check].run is None
    assert instructors_page.PUBLIC in public and "hidden_cases.HIDDEN" not in public
    sources = [p for p in (ROOT / "book").rglob("*.md")] + [ROOT / "_toc.yml"]
    assert not [p for p in sources if "hidden_cases.py" in p.read_text() or "literalinclude" in p.read_text()
                and "grading" in p.read_text()], "a book page includes the hidden cases' source"
