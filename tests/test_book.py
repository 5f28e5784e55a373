"""The book builds the way `make book` builds it (figures, then jupyter-book with warnings as errors), and
the pages and figures it promises are in the output.

The build runs offline in a subprocess into a temporary folder; only book/figures (generated and
gitignored) is written inside the repository.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT = 600  # seconds; the build takes well under a minute on two cores


def _pages() -> list[str]:
    """The HTML page the build must write for every `file:` in _toc.yml (the root included)."""
    text = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    files = re.findall(r"^\s*(?:-\s*file|root):\s*(\S+)\s*$", text, flags=re.M)
    assert "book/index" in files and len(files) > 3, f"could not read the pages from _toc.yml: {files}"
    return [f"{f}.html" for f in files]


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)


def _jupyter_book() -> list[str]:
    """The jupyter-book command of this interpreter's environment."""
    script = Path(sys.executable).with_name("jupyter-book")
    return [str(script)] if script.exists() else [sys.executable, "-m", "jupyter_book.cli.main"]


def _referenced_figures() -> set[str]:
    names: set[str] = set()
    for page in (ROOT / "book").glob("*.md"):
        names |= set(re.findall(r"figures/([\w.-]+\.(?:png|svg|jpg))", page.read_text(encoding="utf-8")))
    return names


def test_book_builds_with_warnings_as_errors_and_has_every_page_and_figure(tmp_path: Path) -> None:
    figures = _run([sys.executable, "-m", "distlab.figures", str(ROOT / "book" / "figures")])
    assert figures.returncode == 0, (
        f"python -m distlab.figures failed:\n{_tail(figures.stdout + figures.stderr)}")

    build = _run([*_jupyter_book(), "build", str(ROOT), "--path-output", str(tmp_path), "-W", "-n",
                  "--keep-going"])
    log = build.stdout + build.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert build.returncode == 0, "jupyter-book build failed (warnings count as errors):\n" + (
        "\n".join(warnings) if warnings else _tail(log))

    html = tmp_path / "_build" / "html"
    missing_pages = [page for page in _pages() if not (html / page).is_file()]
    assert not missing_pages, f"the build did not write {missing_pages}, which _toc.yml lists"

    referenced = _referenced_figures()
    assert referenced, "book/*.md reference no figures/...png; the chapters should show their figures"
    missing_figures = sorted(name for name in referenced if not (html / "_images" / name).is_file())
    assert not missing_figures, (
        f"{missing_figures} are referenced in book/*.md but not in the built _images/; does "
        "`python -m distlab.figures book/figures` write them under these names?")
