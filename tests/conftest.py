"""Session-wide test settings.

Under pytest-xdist (`pytest -n 2 --dist loadgroup`, as `make test` runs), every test that uses the book
builds of tests/book_build.py runs in one worker: the builds are cached per process, so one worker builds
each edition once and draws the figures into book/figures once, instead of two workers doing it twice at
the same time into the same folder.

Exercise checks record their verdicts (`distlab.progress`); the tests point that record at a temporary file
of their own, so that they never write into the clone or over a student's ~/.distlab/progress.json.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    folder = tempfile.mkdtemp(prefix="distlab-progress-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ["DISTLAB_PROGRESS"] = os.path.join(folder, "progress.json")

BOOK_BUILD_FILES = ("test_book.py", "test_browser.py", "test_figures.py")


# tryfirst: xdist's worker turns the mark into a node-id suffix in its own pytest_collection_modifyitems,
# which must see the mark, so ours has to run before it.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.path.name in BOOK_BUILD_FILES:
            item.add_marker(pytest.mark.xdist_group("book"))
