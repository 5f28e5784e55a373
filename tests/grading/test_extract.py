"""What of a notebook the grader runs: read with `ast`, the lab's setup from the course, only the
definitions from the student (no process starts here)."""

from __future__ import annotations

import json

from distlab.grading import engine, extract, guard, registry
from tests.grading.test_grade_class import _plant

STUDENT_CELL = """
import math
print("the student's own output")
def my_segments(n):
    return [n]
open("/tmp/never-written-by-the-grader", "w")
check_sqrt_segments(my_segments)
"""


def test_only_the_students_imports_and_definitions_run(tmp_path):
    nb = tmp_path / "07_memory.ipynb"
    nb.write_text(json.dumps(_plant("07_memory", "my_segments", STUDENT_CELL)))
    code = extract.student_code(nb, ("my_segments",))
    assert code.problem == ""
    assert code.source == "import math\n\ndef my_segments(n):\n    return [n]"


def test_a_missing_function_is_not_written_and_a_broken_cell_is_crashed(tmp_path):
    nb = tmp_path / "07_memory.ipynb"
    nb.write_text(json.dumps(_plant("07_memory", "my_segments", "def my_segments(n):\n    return (\n")))
    assert extract.student_code(nb, ("my_segments",)).kind == "crashed"
    assert extract.student_code(nb, ("my_other",)) == extract.Submitted(problem="no cell defines my_other",
                                                                         kind="not written")
    nb.write_text("not a notebook")
    assert extract.student_code(nb, ("my_segments",)).kind == "crashed"


def test_the_setup_comes_from_the_course_lab_and_never_holds_a_check_call():
    for ex in registry.exercises():
        assert ex.functions, f"{ex.key}: no student function found in its call {ex.call}"
        assert not any(extract.is_check_call(n) for n in extract.ast.walk(extract.ast.parse(ex.context)))


def test_the_guard_tells_writes_and_programs_apart():
    assert guard._wants_write("w", 0) and guard._wants_write("r+", 0) and not guard._wants_write("rb", 0)
    assert guard._wants_write(None, guard.os.O_WRONLY) and not guard._wants_write(None, guard.os.O_RDONLY)
    python = guard.sys.executable
    assert guard._allowed_program((python, [python, "-c", "pass"], None, None))
    assert not guard._allowed_program((python, [python, "-S", "-c", "pass"], None, None))
    assert not guard._allowed_program((None, ["/bin/sh", "-c", "touch x"], None, None))
    assert guard._allowed_program((None, ["fc-list", "--format=%{file}"], None, None))


def test_the_engine_skips_what_is_not_a_line_of_the_child(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text('{"start": "check_merge"}\nnot json\n{"check": "check_merge", "verdict": "maybe"}\n'
                       '[1, 2]\n{"check": "check_merge", "verdict": "fail", "message": "m"}\n{"start": ')
    assert engine.read_lines(results) == [{"start": "check_merge"},
                                          {"check": "check_merge", "verdict": "fail", "message": "m"}]
    assert engine.read_lines(tmp_path / "none.jsonl") == []


def test_a_child_keeps_torchs_compile_caches_in_its_own_folder(tmp_path, monkeypatch) -> None:
    """torch's inductor writes the cache folder it chose into os.environ (TORCHINDUCTOR_CACHE_DIR); a grader
    started after any torch.compile in the same process used to pass /tmp/torchinductor_<user> on, and the
    guard then refused a rank's mkdir there (a 'forbidden write' for a student who only crashed a rank)."""
    from distlab.grading.engine import _environment

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_someone")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/tmp/triton_someone")
    env = _environment(tmp_path)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR", "HOME"):
        assert env[name].startswith(str(tmp_path)), name
