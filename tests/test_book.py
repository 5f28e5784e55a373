"""The book builds the way `make book` and `make book-instructor` build it (figures, then jupyter-book with
warnings as errors, offline), with the pages and figures it promises, and in two editions: the public site
shows no worked solution, the instructor's keeps them.

Each edition is built once per session (tests/book_build.py); tests/test_browser.py opens the same public
build in a browser.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from distlab.student import BEGIN
from tests.book_build import ROOT, Build, build

# A script, stylesheet or image that the page itself loads from another host (a plain <a href> is fine).
REMOTE_ASSET = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=[\"'](?:https?:)?//[^\"']+",
                          re.IGNORECASE)


def _pages() -> list[str]:
    """The HTML page the build must write for every `file:` in _toc.yml (the root included)."""
    text = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    files = re.findall(r"^\s*(?:-\s*file|root):\s*(\S+)\s*$", text, flags=re.M)
    assert "book/index" in files and len(files) > 3, f"could not read the pages from _toc.yml: {files}"
    return [f"{f}.html" for f in files]


def _referenced_figures() -> set[str]:
    names: set[str] = set()
    for page in (ROOT / "book").glob("*.md"):
        names |= set(re.findall(r"figures/([\w.-]+\.(?:png|svg|jpg))", page.read_text(encoding="utf-8")))
    return names


def _built(edition: str) -> Build:
    result = build(edition)
    assert result.returncode == 0, f"the {edition} book build failed (warnings count as errors):\n" + (
        "\n".join(result.warnings()) or result.tail())
    return result


@pytest.fixture(scope="session")
def public() -> Path:
    """The public site's HTML folder (`make book`)."""
    return _built("public").html


@pytest.fixture(scope="session")
def instructor() -> Path:
    """The instructor edition's HTML folder (`make book-instructor`)."""
    return _built("instructor").html


def _lab_pages(html: Path) -> list[Path]:
    pages = sorted((html / "labs").glob("[0-9][0-9]_*.html"))
    assert pages, f"no lab pages under {html / 'labs'}"
    return pages


def _has_exercise(name: str) -> bool:
    """Every chapter's lab ends with exercises; 00_when_a_run_fails is a reading lab beside the
    introduction (three failure reports and how to read them), with nothing to write."""
    return not name.startswith("00_")


def test_book_has_every_page_and_figure(public: Path) -> None:
    missing_pages = [page for page in _pages() if not (public / page).is_file()]
    assert not missing_pages, f"the build did not write {missing_pages}, which _toc.yml lists"
    referenced = _referenced_figures()
    assert referenced, "book/*.md reference no figures/...png; the chapters should show their figures"
    missing_figures = sorted(name for name in referenced if not (public / "_images" / name).is_file())
    assert not missing_figures, (
        f"{missing_figures} are referenced in book/*.md but not in the built _images/; does "
        "`python -m distlab.figures book/figures` write them under these names?")


def test_book_loads_nothing_from_another_host(public: Path) -> None:
    remote = {f"{page.relative_to(public)}: {hit}" for page in public.rglob("*.html")
              for hit in REMOTE_ASSET.findall(page.read_text(encoding="utf-8"))}
    assert not remote, ("the book must read offline, but pages load scripts, stylesheets or images from "
                        "other hosts:\n" + "\n".join(sorted(remote)[:20]))
    mathjax = public / "_static" / "mathjax" / "tex-chtml.js"
    assert mathjax.is_file(), f"{mathjax} is missing: is sphinx-mathjax-offline in _config.yml's extensions?"
    assert '_static/mathjax/tex-chtml.js"' in (public / "book" / "00-intro.html").read_text(encoding="utf-8")


def test_public_site_shows_no_solution_but_keeps_the_checks(public: Path, instructor: Path) -> None:
    leaks = [str(f.relative_to(public)) for f in public.rglob("*") if f.is_file()
             and f.suffix in {".html", ".js", ".ipynb", ".txt", ".json"}
             and BEGIN in f.read_text(encoding="utf-8", errors="replace")]
    assert not leaks, f"the public site gives solutions away ('{BEGIN}' found) in {leaks}"
    for page in _lab_pages(instructor):
        text = page.read_text(encoding="utf-8")
        assert BEGIN in text or not _has_exercise(page.name), (
            f"the instructor edition lost the worked solution of {page.name}")
        public_text = (public / "labs" / page.name).read_text(encoding="utf-8")
        outputs = [len(re.findall(r'class="cell_output', t)) for t in (text, public_text)]
        assert outputs[0] == outputs[1], (
            f"{page.name}: the instructor edition shows {outputs[0]} cell outputs, the public one "
            f"{outputs[1]}; removing a solution's source must keep its output (the check's verdict)")


def test_instructor_edition_says_so_and_both_have_a_favicon(public: Path, instructor: Path) -> None:
    banner = "Instructor edition: these pages contain the worked solution"  # tools/distlab_book.py
    page = "book/04-pipeline.html"
    assert banner in (instructor / page).read_text(encoding="utf-8")
    assert banner not in (public / page).read_text(encoding="utf-8")
    for site in (public, instructor):
        assert 'rel="icon"' in (site / page).read_text(encoding="utf-8") and any(site.rglob("favicon.svg"))


def test_public_download_of_a_lab_is_the_student_version(public: Path) -> None:
    copies = sorted((public / "_sources" / "labs").glob("*.ipynb"))
    assert copies, "the public site has no lab notebooks under _sources/labs (the download button)"
    for copy in copies:
        nb = json.loads(copy.read_text(encoding="utf-8"))
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        stubbed = any("NotImplementedError" in "".join(c["source"]) for c in code)
        assert stubbed or not _has_exercise(copy.name), (
            f"{copy.name}: the downloadable lab should hold the student's stubs")
        assert all(not c["outputs"] for c in code) and "widgets" not in nb["metadata"], (
            f"{copy.name}: the downloadable lab should have no outputs and no widget state")


def test_only_the_instructor_edition_lists_the_hidden_cases(public: Path, instructor: Path) -> None:
    """The grader's hidden cases (distlab.grading.hidden_cases) are on the instructors' page of the
    instructor edition and on no page of the public site, as the worked solutions."""
    import html

    from distlab.grading.hidden_cases import HIDDEN

    # what each exercise's hidden cases cover, as the page shows it (texts Sphinx's smartquotes would change
    # are left out)
    covers = [html.escape(h.covers, quote=False) for h in HIDDEN.values()
              if h.run is not None and not re.search(r"['\"]|--|\.\.\.", h.covers)]
    assert covers
    page = (instructor / "book" / "instructors.html").read_text(encoding="utf-8")
    assert [c for c in covers if c not in page] == [], "the instructor edition lost the hidden cases' table"
    leaks = [str(f.relative_to(public)) for f in public.rglob("*") if f.is_file()
             and f.suffix in {".html", ".js", ".txt", ".json", ".md", ".ipynb"}
             and any(c in f.read_text(encoding="utf-8", errors="replace") for c in covers)]
    assert not leaks, f"the public site lists the hidden cases in {leaks}"
