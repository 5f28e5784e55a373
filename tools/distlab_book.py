"""The distlab book's own Sphinx extension: its two editions and its stylesheet.

`_config.yml` loads this file (``sphinx: local_extensions``). The edition comes from the environment
variable ``DISTLAB_BOOK_EDITION`` (``make book`` and ``make book-instructor`` set it):

- ``public`` (the default): every lab cell that holds a worked solution (a ``# BEGIN SOLUTION`` line) loses
  its source before the notebook is parsed, and is tagged ``remove-input``; its outputs (the check's
  verdict) stay. The copies of the labs under ``_sources/`` (the page's ".ipynb" download button) are
  replaced by the student versions of `distlab.student`, so nothing on the site gives a solution away.
- ``instructor``: the labs exactly as they are, solutions included (they stay folded behind the
  ``hide-input`` toggle), and a banner on every page that says so (`INSTRUCTOR_BANNER`).

The instructors' page (``book/instructors.md``) lists what the grader's hidden cases cover in the
instructor edition only; the public edition says where that list is (`distlab.grading.instructors_page`).

Jupyter Book 1 always loads sphinx-thebe (live code cells through Binder), which this offline book does
not use: it would add to every page a script that names a CDN, declared twice (a console error), and a
Binder configuration. The extension unhooks it.

It also adds ``book/_static/distlab.css`` (wide tables and code scroll inside their own box),
``book/_static/distlab.js`` (says where an interactive widget without a static version runs, since a static
site has no kernel) and plotly.js (copied from the plotly package into ``_static``, so the labs' static
explorers, `distlab.explorers`, draw offline) to every page.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import plotly
from sphinx.application import Sphinx
from sphinx.errors import ConfigError

from distlab.grading import instructors_page
from distlab.student import BEGIN, student_notebook

EDITIONS = ("public", "instructor")
# What a solution cell's source becomes in the public edition (never shown: the cell is tagged remove-input;
# myst-nb drops a cell whose source is empty, outputs and all, so it is not left empty).
OMITTED = "# The worked solution is in the instructor edition of the book."
ENV_VAR = "DISTLAB_BOOK_EDITION"
# The page whose table of hidden cases only the instructor edition shows (distlab.grading.instructors_page).
INSTRUCTORS_PAGE = "book/instructors"
# The theme's announcement bar on every page of the instructor edition: it must never pass for the public one.
INSTRUCTOR_BANNER = ("Instructor edition: these pages contain the worked solution of every exercise. Give "
                     "students the public edition (make book) or their own copies (make lab).")
STATIC = Path(__file__).resolve().parents[1] / "book" / "_static"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"  # the plotly.js of the package


def _edition(app: Sphinx) -> str:
    edition = app.config.distlab_book_edition
    if edition not in EDITIONS:
        raise ConfigError(f"{ENV_VAR}={edition!r} is not a book edition; use one of {', '.join(EDITIONS)}")
    return edition


def _is_notebook(app: Sphinx, docname: str) -> bool:
    return str(app.env.doc2path(docname)).endswith(".ipynb")


def remove_solution_sources(nb: dict) -> int:
    """Replace the source of every code cell of `nb` that holds a solution by `OMITTED` and tag it
    ``remove-input`` (in place); return how many cells changed. Outputs and other cells stay as they are."""
    changed = 0
    for cell in nb.get("cells", []):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        if cell.get("cell_type") != "code" or BEGIN not in source:
            continue
        tags = [t for t in cell.setdefault("metadata", {}).get("tags", []) if t != "hide-input"]
        cell["metadata"]["tags"] = [*tags, "remove-input"]
        cell["source"] = OMITTED
        changed += 1
    return changed


def _on_source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    if docname == INSTRUCTORS_PAGE:
        source[0] = instructors_page.expand(source[0], _edition(app))
    if _edition(app) == "public" and _is_notebook(app, docname):
        nb = json.loads(source[0])
        if remove_solution_sources(nb):
            source[0] = json.dumps(nb)


def _on_build_finished(app: Sphinx, exc: Exception | None) -> None:
    if exc is not None or app.builder.format != "html":
        return
    shutil.copyfile(PLOTLY_JS, Path(app.outdir) / "_static" / PLOTLY_JS.name)
    if _edition(app) != "public":
        return
    for docname in app.env.found_docs:
        copy = Path(app.outdir) / "_sources" / app.env.doc2path(docname, base=False)
        if _is_notebook(app, docname) and copy.is_file():
            nb, _ = student_notebook(json.loads(copy.read_text(encoding="utf-8")), name=docname)
            copy.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _unhook_thebe(app: Sphinx) -> None:
    """Remove what sphinx-thebe registered: its event handlers and its stylesheet."""
    for listeners in app.events.listeners.values():
        listeners[:] = [e for e in listeners if getattr(e.handler, "__module__", "") != "sphinx_thebe"]
    app.registry.css_files = [(name, attrs) for name, attrs in app.registry.css_files
                              if name != "sphinx-thebe.css"]
    added = getattr(app.builder, "_css_files", [])  # what the HTML builder already took from the registry
    added[:] = [c for c in added if Path(getattr(c, "filename", "")).name != "sphinx-thebe.css"]


def _on_config_inited(app: Sphinx, config: object) -> None:
    if app.config.distlab_book_edition == "instructor":
        options = dict(app.config.html_theme_options or {})
        options["announcement"] = INSTRUCTOR_BANNER
        app.config.html_theme_options = options


def _on_builder_inited(app: Sphinx) -> None:
    _edition(app)  # fail early on a misspelt edition
    _unhook_thebe(app)
    app.config.html_static_path.append(str(STATIC))


def setup(app: Sphinx) -> dict:
    """Register the edition setting, the solution filter and the course's static files."""
    app.add_config_value("distlab_book_edition", os.environ.get(ENV_VAR, "public"), "env")
    app.connect("config-inited", _on_config_inited)
    app.connect("builder-inited", _on_builder_inited)
    app.connect("source-read", _on_source_read)
    app.connect("build-finished", _on_build_finished)
    app.add_css_file("distlab.css")
    app.add_js_file("distlab.js")
    app.add_js_file(PLOTLY_JS.name)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
