"""One explorer, two views: an ipywidgets box for JupyterLab and a plotly figure for the static book.

Every lab explorer has one *frame function*: given a setting of its controls (keyword arguments), it
returns what the explorer shows for that setting, either a matplotlib `Figure` (or a list of them, shown
one above the other) or a table as a list of ``(label, value)`` rows. The widget calls the frame function
whenever a control moves. `explorer_box` wraps the widget's children in a box whose rich display also
holds a ``text/html`` version: the same frame function evaluated over a small grid of settings, stored as
one plotly figure with a slider per control. JupyterLab shows the widget (a kernel runs it); the book
(myst-nb prefers ``text/html``, see ``_config.yml``) shows the plotly figure, which runs with no kernel and
no internet (plotly.js is served from the book's ``_static``, ``tools/distlab_book.py``). Because both views
come from the one frame function, they cannot disagree; ``tests/test_explorers.py`` checks it.

`live_explorer` builds the usual live view around a frame function (a control per keyword argument, a redraw
on every move) and hands it to `explorer_box`, so a chapter's explorer is its controls and its grid.
The static grid is computed only when the box is displayed, so building an explorer stays cheap.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

Rows = list[tuple[str, str]]
Frame = Figure | list[Figure] | Rows
DPI = 110  # at most this many pixels per inch in the static frames; a frame is at most WIDTH_PX wide
WIDTH_PX = 760
COLOURS = 64  # the static frames are palette PNGs: small, and the same bytes on every run
TABLE_ROW_PX = 28  # height of one row of a table frame
SLIDER_PX = 88  # height of one slider (its value above the rail, its labels below) under the picture

# Runs in the page after plotly has drawn the figure: a slider move looks up the frame of the setting that
# all sliders now show together, and swaps the picture (or the table's cells) for it.
POST_SCRIPT = """
(function () {
  var gd = document.getElementById("{plot_id}");
  var meta = gd.layout.meta;
  var active = gd.layout.sliders.map(function (s) { return s.active || 0; });
  gd.on("plotly_sliderchange", function (e) {
    active[e.slider._index] = e.step._index;
    var frame = meta.frames[active.join(",")];
    if (frame === undefined) return;
    if (meta.kind === "image") Plotly.relayout(gd, {"images[0].source": frame});
    else Plotly.restyle(gd, {"cells.values": [frame]}, [0]);
  });
})();
"""


def _figures(frame: Frame) -> list[Figure]:
    return [frame] if isinstance(frame, Figure) else list(frame)


def png(frame: Figure | Sequence[Figure]) -> str:
    """The static picture of a frame: its figure(s) one above the other as a palette PNG, as a data URI.
    The same frame gives the same bytes on every run (no timestamp, no software tag)."""
    from PIL import Image

    images = []
    for fig in _figures(frame):  # type: ignore[arg-type]
        buffer = io.BytesIO()
        dpi = min(DPI, WIDTH_PX / fig.get_figwidth())
        fig.savefig(buffer, format="png", dpi=dpi, facecolor="white", metadata={"Software": None})
        images.append(Image.open(buffer).convert("RGB"))
    sheet = Image.new("RGB", (max(i.width for i in images), sum(i.height for i in images)), "white")
    top = 0
    for image in images:
        sheet.paste(image, (0, top))
        top += image.height
    out = io.BytesIO()
    sheet.quantize(COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, "png",
                                                                                           optimize=True)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def message_figure(text: str, monospace: bool = False) -> Figure:
    """A frame that only says something: a setting the explorer cannot draw and why, or lines of numbers
    (`monospace`) to show under a figure."""
    lines = text.count("\n") + 1
    fig = Figure(figsize=(7, 0.25 * lines + 0.3))
    fig.text(0.02, 0.5, text, va="center", ha="left", wrap=not monospace, fontsize=9,
             family="monospace" if monospace else None)
    return fig


def rows_html(rows: Rows) -> str:
    """A frame that is a table, as the HTML the widget shows."""
    cells = "".join(f"<tr><td>{html.escape(a)}</td><td>{html.escape(v)}</td></tr>" for a, v in rows)
    return f"<table>{cells}</table>"


def is_table(frame: Frame) -> bool:
    """Whether a frame is a table of (label, value) rows rather than figures."""
    return isinstance(frame, list) and all(isinstance(r, tuple) for r in frame)


def static_frames(draw: Callable[..., Frame], grid: Mapping[str, Sequence[Any]],
                  fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`draw` over every setting of `grid` (controls that are not in the grid keep their `fixed` value).

    Keys are the positions of the setting's values in `grid`, joined by commas ("0,2"); values are PNG data
    URIs for figures, or ``[labels, values]`` columns for tables.
    """
    if not grid or any(len(values) == 0 for values in grid.values()):
        raise ValueError(f"grid={dict(grid)!r} needs at least one control with at least one value")
    frames: dict[str, Any] = {}
    names = list(grid)
    for index in itertools.product(*(range(len(grid[n])) for n in names)):
        setting = {**(fixed or {}), **{n: grid[n][i] for n, i in zip(names, index, strict=True)}}
        frame = draw(**setting)
        key = ",".join(map(str, index))
        frames[key] = [[a for a, _ in frame], [v for _, v in frame]] if is_table(frame) else png(frame)
    return frames


def _image_height(uri: str) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as image:
        return image.width, image.height


def static_figure(draw: Callable[..., Frame], grid: Mapping[str, Sequence[Any]],
                  fixed: Mapping[str, Any] | None = None, start: Mapping[str, Any] | None = None) -> Any:
    """The plotly figure of the static view: one slider per control of `grid`, starting at `start` (the
    widget's initial values), and the frames of `static_frames` in ``layout.meta``."""
    import plotly.graph_objects as go

    frames = static_frames(draw, grid, fixed)
    names = list(grid)
    start = start or {}
    active = [list(grid[n]).index(start[n]) if start.get(n) in list(grid[n]) else 0 for n in names]
    first = frames[",".join(map(str, active))]
    kind = "image" if isinstance(first, str) else "table"
    controls = SLIDER_PX * len(names)
    if kind == "image":
        height = max(round(h * WIDTH_PX / max(w, WIDTH_PX)) for w, h in map(_image_height, frames.values()))
        fig = go.Figure()
        fig.add_layout_image(source=first, xref="paper", yref="paper", x=0, y=1, sizex=1,
                             sizey=height / (height + controls), xanchor="left", yanchor="top",
                             sizing="contain", layer="above")
        fig.update_xaxes(visible=False, range=[0, 1])
        fig.update_yaxes(visible=False, range=[0, 1])
    else:
        # Cells of a fixed height, and the table's domain exactly that tall: no blank band between the
        # table and the sliders below it.
        height = TABLE_ROW_PX * (len(first[0]) + 1) + 2
        fig = go.Figure(go.Table(header={"values": ["quantity", "value"], "height": TABLE_ROW_PX},
                                 cells={"values": first, "align": "left", "height": TABLE_ROW_PX},
                                 columnwidth=[3, 1], domain={"y": [controls / (height + controls), 1]}))
    total = height + controls
    fig.update_layout(
        template="none", height=total, margin={"l": 8, "r": 8, "t": 8, "b": 8},
        paper_bgcolor="white", plot_bgcolor="white", meta={"kind": kind, "frames": frames},
        sliders=[{"active": a, "currentvalue": {"prefix": f"{n} = "}, "pad": {"t": 28, "b": 4},
                  "len": 1.0, "x": 0, "y": (controls - SLIDER_PX * i) / total, "yanchor": "top",
                  "steps": [{"method": "skip", "label": str(v), "args": [None]} for v in grid[n]]}
                 for i, (n, a) in enumerate(zip(names, active, strict=True))])
    return fig


def _shown(value: Any) -> str:
    """A held setting as the note under an explorer names it: "no" for False, "yes" for True."""
    return {True: "yes", False: "no"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def static_html(name: str, draw: Callable[..., Frame], grid: Mapping[str, Sequence[Any]],
                fixed: Mapping[str, Any] | None = None, start: Mapping[str, Any] | None = None) -> str:
    """`static_figure` as HTML with a fixed div id (``distlab-<name>``, so stored outputs do not change
    from run to run) and without plotly.js itself (the book serves it once, from ``_static``)."""
    held = ", ".join(f"{k} = {_shown(v)}" for k, v in (fixed or {}).items())
    note = ('<p class="distlab-explorer-note">Precomputed explorer: drag a slider to pick a setting'
            + (f"; the other settings are held at {html.escape(held)}" if held else "")
            + " (in JupyterLab the same explorer runs live, over every value).</p>")
    figure = static_figure(draw, grid, fixed, start).to_html(
        full_html=False, include_plotlyjs=False, div_id=f"distlab-{name}", post_script=POST_SCRIPT,
        config={"displayModeBar": False, "responsive": True, "staticPlot": False})
    return f'<div class="distlab-explorer">{note}{figure}</div>'


@functools.cache
def _box_class() -> type:
    import ipywidgets

    class ExplorerBox(ipywidgets.VBox):
        """A VBox whose rich display also carries the static version (computed on first display)."""

        _static: Callable[[], str] | None = None

        def _repr_mimebundle_(self, **kwargs: Any) -> dict:
            bundle = super()._repr_mimebundle_(**kwargs)
            if self._static is not None:
                bundle["text/html"] = self._static()
            return bundle

    return ExplorerBox


def explorer_box(children: Sequence[Any], name: str, draw: Callable[..., Frame],
                 grid: Mapping[str, Sequence[Any]], fixed: Mapping[str, Any] | None = None,
                 start: Mapping[str, Any] | None = None) -> Any:
    """An ipywidgets VBox of `children` (the live explorer, whose controls call `draw`) that also displays
    as `static_html` of `draw` over `grid` (with `fixed` for the controls left out of the grid)."""
    box = _box_class()(list(children))
    box._static = functools.cache(functools.partial(static_html, name, draw, grid, fixed, start))
    return box


def live_explorer(name: str, draw: Callable[..., Frame], controls: Mapping[str, Any],
                  grid: Mapping[str, Sequence[Any]], layout: Sequence[Any] | None = None,
                  adjust: Callable[[Mapping[str, Any]], None] | None = None,
                  start: Mapping[str, Any] | None = None) -> Any:
    """The explorer of the frame function `draw`, both views: `controls` maps each keyword argument of
    `draw` to its ipywidgets control, and any move redraws (calling `adjust(controls)` first, say to bound
    one control by another). Figures go to an `Output`, a table to an `HTML` widget (`rows_html`), under
    the controls: one row of them, or the widgets of `layout`, which hold them. The static view is
    `explorer_box` over `grid`; a control outside `grid` is held at its initial value, and the static
    sliders start at `start` (default: where the controls start). An `ipywidgets.fixed` among `controls`
    holds its argument in both views without a control (give `layout` then: it has nothing to show)."""
    import ipywidgets as widgets
    from IPython.display import display

    def frame() -> Frame:
        if adjust is not None:
            adjust(controls)
        return draw(**{k: c.value for k, c in controls.items()})

    first = frame()
    out = widgets.HTML() if is_table(first) else widgets.Output()

    def show(shown: Frame) -> None:
        if is_table(shown):
            out.value = rows_html(shown)
            return
        with out:
            out.clear_output(wait=True)
            for fig in _figures(shown):
                display(fig)

    for control in controls.values():
        control.observe(lambda _: show(frame()), names="value")
    show(first)
    initial = {k: c.value for k, c in controls.items()}
    held = {k: v for k, v in initial.items() if k not in grid} or None
    start = {k: v for k, v in initial.items() if k in grid} if start is None else start
    rows = [widgets.HBox(list(controls.values()))] if layout is None else list(layout)
    return explorer_box([*rows, out], name, draw, grid, held, start)


def frame_json(html_text: str) -> dict:
    """The plotly figure stored in `static_html`'s output, as a dict (for tests and the browser check)."""
    start = html_text.index("Plotly.newPlot(")
    decoder = json.JSONDecoder()
    rest = html_text[start + len("Plotly.newPlot("):]
    rest = rest[rest.index(",") + 1:].lstrip()
    data, end = decoder.raw_decode(rest)
    rest = rest[end:].lstrip(", \n")
    layout, _ = decoder.raw_decode(rest)
    return {"data": data, "layout": layout}
