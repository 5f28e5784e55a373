"""The book's figure registry, course-wide: every figure a chapter includes is registered once, and
`python -m distlab.figures` writes exactly those. Each chapter's own figures are tested with the chapter
(tests/collectives/test_collectives_figures.py for chapter 1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distlab import figures as book
from tests import book_build


def book_figure_files() -> set[str]:
    """Every figures/NAME.png that a page of the book includes."""
    root = Path(__file__).resolve().parents[1] / "book"
    return {m for page in root.glob("*.md") for m in re.findall(r"figures/([\w.-]+\.png)", page.read_text())}


# --- the book's figures ------------------------------------------------------------------------------

def test_registry_names_exactly_the_book_files():
    names = [f.filename for f in book.BOOK_FIGURES]
    assert len(names) == len(set(names)), "a figure file name is registered twice"
    assert set(names) == book_figure_files(), "the registry and the figures the book includes differ"


def test_python_m_distlab_figures_writes_exactly_the_book_files():
    # The same run of `python -m distlab.figures book/figures` that the book builds use (tests/book_build.py
    # makes it once per session): drawing every figure takes a minute on two cores, so it is not drawn twice.
    out = book_build.figures()
    assert out.returncode == 0, out.stderr
    wrote = [Path(line.removeprefix("wrote ").strip()) for line in out.stdout.splitlines()
             if line.startswith("wrote ")]
    names = sorted(p.name for p in wrote)
    assert names == sorted(f.filename for f in book.BOOK_FIGURES), "it wrote other files than the registry's"
    assert all(p.parent == book_build.ROOT / "book" / "figures" for p in wrote)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in wrote)


def test_unknown_figure_name_is_refused(capsys):
    with pytest.raises(SystemExit):
        book.main(["/tmp/unused", "--only", "ring.png"])
    assert "unknown figure(s) ['ring.png']; choose from semantics-broadcast.png" in capsys.readouterr().err
