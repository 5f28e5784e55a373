"""The mark lists, tests/ranks.txt (the tests that start processes, marked `ranks`) and tests/slow.txt (the
slow ones in one process, marked `slow`; `pytest -m "not ranks and not slow"` is the quick unit run), and
the guard that keeps the ranks list true."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import GUARD, MARK_LISTS, TESTS, ProcessGuard, list_entries


def _test_functions(path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_entry_names_a_test_file_or_function_that_exists():
    """An entry left behind by a moved, renamed or deleted test would mark nothing: it fails here."""
    functions: dict = {}
    for path in MARK_LISTS.values():
        stale = []
        for entry in sorted(list_entries(path)):
            file, _, name = entry.partition("::")
            if not (TESTS / file).is_file():
                stale.append(entry)
            elif name and name not in functions.setdefault(file, _test_functions(TESTS / file)):
                stale.append(entry)
        assert not stale, f"tests/{path.name} names tests that do not exist: {stale}"


def test_the_guard_counts_process_events_and_launches_only_inside_a_test():
    guard = ProcessGuard()
    guard.audit("subprocess.Popen", ())
    launch = guard.wrap(lambda *a: "ranks")
    assert launch() == "ranks" and guard.started == []  # outside a test: not counted
    guard.running = True
    guard.audit("open", ("x", "r", 0))
    guard.audit("os.fork", ())
    assert launch() == "ranks"
    assert guard.started == ["os.fork", "distlab.launch ranks"]


def test_the_sessions_guard_sees_a_subprocess(request):
    """Listed in tests/ranks.txt: a test that starts a process is seen by the guard conftest.py installs."""
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert "subprocess.Popen" in request.config.stash[GUARD].started
