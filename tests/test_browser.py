"""The public book in a real browser: every page of `make book`'s site, opened in headless Chromium.

The site is served from 127.0.0.1 and every request to another host is refused and reported, so a page
that works only online fails here. On each page: no console errors, maths typeset by MathJax (no raw
``\\(`` left), every image loaded, and nothing wider than the text column (wide tables and code scroll
inside their own box, book/_static/distlab.css). A full-page screenshot of each page goes to
_build/screenshots/ for a person to look at.

It uses the system's Chromium (Debian's ``chromium``; ``.ci/run`` installs it) through Playwright, with no
browser download. Without Chromium the test is skipped, except in CI (``CI=true``), where it must run.
Other tests can open a page of the same build with `open_page(site, "labs/01_collectives.html")`.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.book_build import ROOT, build

SCREENSHOTS = ROOT / "_build" / "screenshots"
VIEWPORT = {"width": 1280, "height": 900}
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MATHJAX_TIMEOUT_MS = 20_000

# Runs in the page once it has loaded; returns what the checks below look at.
INSPECT = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  const images = [...document.images];
  for (const img of images) img.loading = "eager";
  await Promise.all(images.map((img) => img.decode().catch(() => null)));
  const brokenImages = images.filter((img) => img.naturalWidth === 0).map((img) => img.getAttribute("src"));

  const maths = [...document.querySelectorAll(".math")];
  const untypeset = maths.filter((m) => !m.querySelector("mjx-container")).map((m) => m.textContent.trim());
  for (const error of document.querySelectorAll("mjx-merror")) {
    untypeset.push(`MathJax error: ${error.getAttribute("data-mjx-error") || error.textContent}`);
  }
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {
    acceptNode: (n) => n.parentElement.closest("pre, code, script, style, textarea, mjx-container")
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
  });
  const rawTex = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const at = n.nodeValue.search(/\\\\\\(|\\\\\\[|\\$\\$/);
    if (at >= 0) rawTex.push(n.nodeValue.slice(Math.max(0, at - 20), at + 40));
  }

  const column = document.querySelector("article.bd-article") || document.querySelector("main");
  const right = column.getBoundingClientRect().right + 1;
  const clipped = (el) => {
    for (let a = el.parentElement; a && a !== column; a = a.parentElement) {
      const scrolls = getComputedStyle(a).overflowX !== "visible";
      if (scrolls && a.getBoundingClientRect().right <= right) return true;
    }
    return false;
  };
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
    + [...el.classList].slice(0, 3).map((c) => "." + c).join("");
  const wide = [];
  for (const el of column.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.right <= right || clipped(el)) continue;
    if (el.parentElement && wide.some((w) => w.el === el.parentElement)) continue;
    const where = `reaches ${Math.round(box.right)}px, the column ends at ${Math.round(right)}px`;
    wide.push({el, text: `${name(el)} ${where}`});
  }
  return {brokenImages, maths: maths.length, untypeset, rawTex, wide: wide.map((w) => w.text).slice(0, 10)};
}
"""


@dataclass
class Visit:
    """What one page did and showed in the browser."""

    path: str
    console_errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Site:
    """The public build served on 127.0.0.1, and a browser context to open its pages in (one context for
    all pages, so that MathJax and the theme's scripts come from the browser's cache after the first)."""

    html: Path
    url: str
    context: object  # playwright.sync_api.BrowserContext


def _chromium() -> str | None:
    """The Chromium to drive: $DISTLAB_CHROMIUM, or the first of CHROMIUM_NAMES on the PATH."""
    if os.environ.get("DISTLAB_CHROMIUM"):
        return os.environ["DISTLAB_CHROMIUM"]
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; in CI the browser test must run (.ci/run installs Debian's chromium)")
    pytest.skip(reason)


def site_pages(html: Path) -> list[str]:
    """Every page of the site (relative paths), leaving out Sphinx's folders and bare redirects."""
    pages = []
    for page in sorted(html.rglob("*.html")):
        relative = page.relative_to(html)
        redirect = 'http-equiv="Refresh"' in page.read_text(encoding="utf-8")[:200]
        if relative.parts[0].startswith("_") or redirect:
            continue
        pages.append(relative.as_posix())
    return pages


@contextlib.contextmanager
def _serve(html: Path) -> Iterator[str]:
    """Serve `html` on 127.0.0.1 (a free port) for the duration of the block; yield its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(html)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def site() -> Iterator[Site]:
    """The public build (shared with tests/test_book.py), served locally, with a headless Chromium."""
    executable = _chromium()
    if executable is None:
        _missing(f"no Chromium found (looked for {', '.join(CHROMIUM_NAMES)}; set DISTLAB_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (it is a dependency: `pip install -e .`)")
    built = build("public")
    assert built.returncode == 0, "the public book build failed:\n" + (
        "\n".join(built.warnings()) or built.tail())
    with _serve(built.html) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            yield Site(built.html, url, browser.new_context(viewport=VIEWPORT))
        finally:
            browser.close()


@contextlib.contextmanager
def open_page(site: Site, path: str, visit: Visit | None = None) -> Iterator[object]:
    """Open `path` of the site in a fresh browser page; yield the Playwright page once it has loaded.

    Requests that leave 127.0.0.1 are refused; console errors and refused requests go to `visit`.
    """
    visit = visit if visit is not None else Visit(path)
    own_host = urlsplit(site.url).netloc
    page = site.context.new_page()

    def route(r: object) -> None:
        url = r.request.url
        if urlsplit(url).scheme in ("data", "blob") or urlsplit(url).netloc == own_host:
            r.continue_()
        else:
            visit.foreign_requests.append(url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: m.type == "error" and visit.console_errors.append(m.text))
    page.on("pageerror", lambda e: visit.console_errors.append(f"uncaught: {e}"))
    try:
        page.goto(site.url + path, wait_until="load")
        yield page
    finally:
        page.close()


@pytest.fixture(scope="session")
def visits(site: Site) -> list[Visit]:
    """Every page of the site, visited once: its console, its requests, the facts INSPECT reports, and a
    full-page screenshot in _build/screenshots/."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    out = []
    for path in site_pages(site.html):
        visit = Visit(path)
        with open_page(site, path, visit) as page:
            page.set_default_timeout(MATHJAX_TIMEOUT_MS)
            visit.facts = page.evaluate(INSPECT)
            page.screenshot(path=SCREENSHOTS / (path.removesuffix(".html").replace("/", "-") + ".png"),
                            full_page=True)
        out.append(visit)
    assert len(out) > 5, f"only {len(out)} pages found in {site.html}"
    return out


def _report(visits: list[Visit], problems: object) -> str:
    lines = [f"{v.path}: {p}" for v in visits for p in problems(v)]  # type: ignore[operator]
    return "\n".join(lines[:40])


def test_no_page_reaches_another_host(visits: list[Visit]) -> None:
    report = _report(visits, lambda v: v.foreign_requests)
    assert not report, "pages request files from other hosts (the book must read offline):\n" + report


def test_no_console_errors(visits: list[Visit]) -> None:
    report = _report(visits, lambda v: v.console_errors)
    assert not report, "the browser console shows errors:\n" + report


def test_maths_is_typeset(visits: list[Visit]) -> None:
    report = _report(visits, lambda v: [f"not typeset: {m!r}" for m in v.facts["untypeset"][:5]]
                     + [f"raw TeX in the text: {t!r}" for t in v.facts["rawTex"][:5]])
    assert not report, "MathJax left maths untypeset:\n" + report
    assert sum(v.facts["maths"] for v in visits) > 50, "the book should hold plenty of maths; found little"


def test_every_image_loads(visits: list[Visit]) -> None:
    report = _report(visits, lambda v: [f"image did not load: {src}" for src in v.facts["brokenImages"]])
    assert not report, report


def test_nothing_is_wider_than_the_text_column(visits: list[Visit]) -> None:
    report = _report(visits, lambda v: v.facts["wide"])
    assert not report, ("elements overflow the text column (make them scroll inside their box in "
                        "book/_static/distlab.css):\n" + report)


# The static explorer of lab 1 (distlab.explorers): the plotly figure, its frame and its sliders' rails.
EXPLORER_PAGE, EXPLORER_ID = "labs/01_collectives.html", "distlab-ring-all-reduce"
EXPLORER_STATE = """
(id) => {
  const gd = document.getElementById(id);
  if (!gd || !gd.layout) return null;
  const rails = [...gd.querySelectorAll("rect.slider-rail-touch-rect")].map((r) => {
    const box = r.getBoundingClientRect();
    return {x: box.x, y: box.y, width: box.width, height: box.height};
  });
  return {frame: gd.layout.images[0].source, frames: Object.keys(gd.layout.meta.frames).length,
          active: gd.layout.sliders.map((s) => s.active), rails};
}
"""


def test_moving_an_explorer_slider_changes_its_figure(site: Site) -> None:
    """Lab 1's ring explorer in the static book: dragging its "step" slider to the end shows another
    precomputed frame (another picture), with no kernel and no request leaving the machine."""
    visit = Visit(EXPLORER_PAGE)
    with open_page(site, EXPLORER_PAGE, visit) as page:
        page.wait_for_function(f"() => document.getElementById({EXPLORER_ID!r})?.layout", timeout=20_000)
        page.locator(f"#{EXPLORER_ID}").scroll_into_view_if_needed()
        before = page.evaluate(EXPLORER_STATE, EXPLORER_ID)
        assert before is not None and before["frames"] > 1 and len(before["rails"]) == 2, before
        rail = before["rails"][-1]  # the "step" slider, which starts at step 0
        page.mouse.click(rail["x"] + rail["width"] - 4, rail["y"] + rail["height"] / 2)
        page.wait_for_timeout(300)
        after = page.evaluate(EXPLORER_STATE, EXPLORER_ID)
        page.screenshot(path=SCREENSHOTS / "explorer-after-slider.png", full_page=False)
    assert after["active"] != before["active"], f"the slider did not move: {before['active']}"
    assert after["frame"] != before["frame"], "moving the slider left the explorer's picture unchanged"
    assert not visit.console_errors, visit.console_errors
    assert not visit.foreign_requests, visit.foreign_requests


# Lab 7's static estimator explorer: it names the settings it holds, leaves no blank band above its sliders,
# and in dark mode stays inside the text column.
MEMORY_PAGE, MEMORY_ID = "labs/07_memory.html", "distlab-memory-estimator"
MEMORY_STATE = """
(id) => {
  const gd = document.getElementById(id);
  if (!gd || !gd.layout) return null;
  const box = gd.closest(".distlab-explorer");
  const note = box.querySelector(".distlab-explorer-note").textContent;
  const column = document.querySelector("article.bd-article") || document.querySelector("main");
  const table = gd.querySelector(".table").getBoundingClientRect();
  const rails = [...gd.querySelectorAll("rect.slider-rail-touch-rect")].map((r) => r.getBoundingClientRect());
  const cells = [...gd.querySelectorAll(".table .cell-text")].map((t) => t.textContent);
  return {note, cells, right: gd.getBoundingClientRect().right,
          column: column.getBoundingClientRect().right + 1,
          gap: Math.min(...rails.map((r) => r.top)) - table.bottom};
}
"""


def test_lab7s_explorer_names_what_it_holds_and_fits_in_dark_mode(site: Site) -> None:
    with open_page(site, MEMORY_PAGE) as page:
        page.wait_for_function(f"() => document.getElementById({MEMORY_ID!r})?.layout", timeout=20_000)
        page.evaluate("() => { document.documentElement.dataset.theme = 'dark'; "
                      "window.dispatchEvent(new Event('resize')); }")
        page.wait_for_timeout(300)
        state = page.evaluate(MEMORY_STATE, MEMORY_ID)
        page.locator(f"#{MEMORY_ID}").scroll_into_view_if_needed()
        page.screenshot(path=SCREENSHOTS / "explorer-memory-dark.png", full_page=False)
    assert "held at tp = 8, pp = 8, schedule = 1f1b, micro_batch = 1, offload = no" in state["note"], state
    assert state["right"] <= state["column"], f"the explorer overflows the column: {state}"
    assert state["gap"] < 60, f"a blank band of {state['gap']:.0f}px sits between the table and the sliders"
    assert "0.0 GB" not in state["cells"][:5], state["cells"]


# An exercise check's report (distlab.checks.CheckResult) on the site: its columns do not run together.
CHECK_TABLE = """
() => {
  const out = [];
  for (const table of document.querySelectorAll("div.cell_output table")) {
    const head = [...table.querySelectorAll("th")].map((th) => th.textContent.trim());
    if (!head.includes("result") || !head.includes("what is wrong")) continue;
    const row = table.querySelector("tr:nth-child(2)");
    const [a, b] = [...row.querySelectorAll("td")].map((td) => {
      const range = document.createRange();
      range.selectNodeContents(td);
      return range.getBoundingClientRect();
    });
    out.push({space: b.left - a.right, label: row.textContent.trim().slice(0, 40)});
  }
  return out;
}
"""


def test_check_reports_render_as_tables_whose_columns_stand_apart(site: Site) -> None:
    with open_page(site, "labs/09_putting_it_together.html") as page:
        tables = page.evaluate(CHECK_TABLE)
    assert tables, "lab 9's page shows no exercise check table"
    crowded = [t for t in tables if t["space"] < 8]
    assert not crowded, f"the check tables' first two columns run together: {crowded}"
