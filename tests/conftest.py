"""Session-wide test settings.

Under pytest-xdist (`pytest -n 2 --dist loadgroup`, as `make test` runs), every test that uses the book
builds of tests/book_build.py runs in one worker: the builds are cached per process, so one worker builds
each edition once and draws the figures into book/figures once, instead of two workers doing it twice at
the same time into the same folder.

Exercise checks record their verdicts (`distlab.progress`); the tests point that record at a temporary file
of their own, so that they never write into the clone or over a student's ~/.distlab/progress.json.

The tests listed in tests/ranks.txt start processes (ranks, torchrun, the book builds, a command in a
subprocess) and are marked `ranks`; those in tests/slow.txt run in one process but take seconds and are
marked `slow`; `pytest -m "not ranks and not slow" tests` is the quick unit run. A guard
keeps the list true: a test that starts a process (Python's audit events for subprocess, fork and spawn,
and `distlab.launch`'s start of the ranks, which its fork helper makes without a new subprocess) and is
not marked fails, naming the line to add.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# marker -> the list of the tests it marks (tests/ranks.txt, tests/slow.txt): one entry a line, relative to
# tests/, a file (every test in it) or file::test_function (all its parameters)
MARK_LISTS = {"ranks": TESTS / "ranks.txt", "slow": TESTS / "slow.txt"}
# Python's audit events of a new process (https://docs.python.org/3/library/audit_events.html)
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                            "os.system", "os.exec"})


def pytest_configure(config: pytest.Config) -> None:
    folder = tempfile.mkdtemp(prefix="distlab-progress-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ["DISTLAB_PROGRESS"] = os.path.join(folder, "progress.json")
    config.stash[GUARD] = guard = ProcessGuard()
    sys.addaudithook(guard.audit)
    from distlab.launch import processes

    processes.start_ranks = guard.wrap(processes.start_ranks)


class ProcessGuard:
    """Which processes the running test has started (none outside a test is counted)."""

    def __init__(self) -> None:
        self.running = False
        self.started: list[str] = []

    def audit(self, event: str, args: tuple) -> None:
        if self.running and event in PROCESS_EVENTS:
            self.started.append(event)

    def wrap(self, start_ranks):
        def start(*args, **kwargs):
            if self.running:
                self.started.append("distlab.launch ranks")
            return start_ranks(*args, **kwargs)

        return start


GUARD = pytest.StashKey[ProcessGuard]()


def list_entries(path: Path) -> set[str]:
    """A mark list's entries: `folder/test_file.py` or `folder/test_file.py::test_function`."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def list_entry(item: pytest.Item) -> str:
    """The line of a mark list that names this test."""
    return f"{item.path.relative_to(TESTS).as_posix()}::{getattr(item, 'originalname', item.name)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    guard = item.config.stash[GUARD]
    guard.running, guard.started = True, []
    yield
    guard.running = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = (yield).get_result()
    started = item.config.stash[GUARD].started
    if report.when == "teardown" and started and item.get_closest_marker("ranks") is None:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started a process ({', '.join(sorted(set(started)))}) but is not "
                           f"marked `ranks`: add the line {list_entry(item)} to tests/ranks.txt")

BOOK_BUILD_FILES = ("test_book.py", "test_browser.py", "test_figures.py")


# tryfirst: xdist's worker turns the mark into a node-id suffix in its own pytest_collection_modifyitems,
# which must see the mark, so ours has to run before it.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed = {mark: list_entries(path) for mark, path in MARK_LISTS.items()}
    xdist = config.pluginmanager.hasplugin("xdist")
    for item in items:
        entry = list_entry(item)
        for mark, entries in listed.items():
            if entry in entries or entry.split("::")[0] in entries:
                item.add_marker(mark)
        if xdist and item.path.name in BOOK_BUILD_FILES:
            item.add_marker(pytest.mark.xdist_group("book"))
