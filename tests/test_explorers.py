"""The labs' explorers: the ipywidgets view (JupyterLab) and the static plotly view (the book) come from
one frame function per explorer (`distlab.explorers`), so they cannot disagree.

For every explorer: its box carries a static version built from the same frame function the widget calls;
the static frames at a few settings of its grid equal that function's output drawn directly; and the
static HTML has a fixed div id, no plotly.js and no CDN. The full grids are drawn by the labs (and shown by
the book); here only a few settings each, to keep the test short.
"""

from __future__ import annotations

import importlib
import itertools

import pytest

from distlab import explorers

EXPLORERS = [  # (module, explorer, frame function)
    ("distlab.collectives.figures.schedules", "ring_all_reduce_explorer", "ring_all_reduce_frame"),
    ("distlab.data_parallel.figures", "timeline_explorer", "timeline_frame"),
    ("distlab.async_sgd.figures", "schedule_explorer", "schedule_frame"),
    ("distlab.pipeline.figures", "pipeline_explorer", "pipeline_frame"),
    ("distlab.pipeline.figures", "zero_bubble_explorer", "zero_bubble_figure"),
    ("distlab.tensor_parallel.figures", "comm_explorer", "comm_frame"),
    ("distlab.moe.figures", "moe_explorer", "moe_frame"),
    ("distlab.memory.figures", "estimator_explorer", "estimator_frame"),
    ("distlab.hardware.figures", "explorer", "explorer_frame"),
    ("distlab.fault_tolerance.figures", "goodput_explorer", "goodput_frame"),
    ("distlab.observe.figures", "hang_explorer", "hang_frame"),
]


def _box(module: str, name: str):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("plotly")
    return getattr(importlib.import_module(module), name)()


def _settings(grid: dict, fixed: dict | None) -> list[tuple[tuple[int, ...], dict]]:
    """One setting of `grid`, away from the start: its last point (with its positions)."""
    names = list(grid)
    points = list(itertools.product(*(range(len(grid[n])) for n in names)))
    return [(index, {**(fixed or {}), **{n: grid[n][i] for n, i in zip(names, index, strict=True)}})
            for index in (points[-1],)]


@pytest.mark.parametrize("module, name, frame", EXPLORERS, ids=[e[1] for e in EXPLORERS])
def test_static_frames_are_the_frame_function_drawn(module: str, name: str, frame: str) -> None:
    box = _box(module, name)
    _, draw, grid, fixed, start = box._static.__wrapped__.args
    assert draw is getattr(importlib.import_module(module), frame), "the static view draws another function"
    frames = 1
    for values in grid.values():
        frames *= len(values)
    assert 2 <= frames <= 60, f"{name}: {frames} static frames (keep the grid to tens of frames)"
    assert all(start[n] in grid[n] for n in grid), f"{name} starts at a setting outside its static grid"
    for index, setting in _settings(grid, fixed):
        one = {n: [setting[n]] for n in grid}  # the grid cut down to this one setting
        (stored,) = explorers.static_frames(draw, one, fixed).values()
        direct = draw(**setting)
        expected = [list(c) for c in zip(*direct, strict=True)] if explorers.is_table(direct) else \
            explorers.png(direct)
        assert stored == expected, f"{name}: the static frame {index} ({setting}) differs from {frame}"


TABLE_CONTROLS = {"comm_explorer": ["b", "s", "h", "p"],
                  "estimator_explorer": ["dp", "tp", "pp", "zero", "recompute", "schedule", "micro_batch",
                                         "offload"]}


@pytest.mark.parametrize("name", list(TABLE_CONTROLS))
def test_table_explorers_widget_and_static_view_agree(name: str) -> None:
    module, _, frame = next(e for e in EXPLORERS if e[1] == name)
    box = _box(module, name)
    draw = getattr(importlib.import_module(module), frame)
    controls = dict(zip(TABLE_CONTROLS[name], [c for row in box.children[:-1] for c in row.children],
                        strict=True))
    next(iter(controls.values())).value = 4  # move one control: the widget redraws
    assert box.children[-1].value == explorers.rows_html(draw(**{k: c.value for k, c in controls.items()}))
    figure = explorers.frame_json(box._repr_mimebundle_()["text/html"])
    meta = figure["layout"]["meta"]
    _, _, grid, fixed, _ = box._static.__wrapped__.args
    assert meta["kind"] == "table" and len(figure["layout"]["sliders"]) == len(grid)
    for key, cells in meta["frames"].items():
        setting = {**(fixed or {}), **{n: grid[n][int(i)] for n, i in zip(grid, key.split(","), strict=True)}}
        assert cells == [list(c) for c in zip(*draw(**setting), strict=True)], f"{name} at {setting}"


def test_static_html_is_offline_and_the_same_on_every_run() -> None:
    from distlab.tensor_parallel.figures import comm_frame

    grid = {"b": [1, 2], "p": [2, 8]}
    one = explorers.static_html("t", comm_frame, grid)
    assert one == explorers.static_html("t", comm_frame, grid)
    assert 'id="distlab-t"' in one and "cdn" not in one.lower() and "plotly.min.js" not in one
    layout = explorers.frame_json(one)["layout"]
    assert [s["currentvalue"]["prefix"] for s in layout["sliders"]] == ["b = ", "p = "]
    assert sorted(layout["meta"]["frames"]) == ["0,0", "0,1", "1,0", "1,1"]


def test_bad_grid_is_rejected_with_a_message() -> None:
    from distlab.tensor_parallel.figures import comm_frame

    with pytest.raises(ValueError, match=r"grid=\{'b': \[\]\} needs at least one control with at least one"):
        explorers.static_frames(comm_frame, {"b": []})


def test_live_explorer_adjusts_then_redraws_and_holds_the_controls_outside_the_grid() -> None:
    widgets = pytest.importorskip("ipywidgets")
    pytest.importorskip("plotly")
    drawn = []

    def draw(a: int = 1, b: int = 2) -> list[tuple[str, str]]:
        drawn.append((a, b))
        return [("a", str(a)), ("b", str(b))]

    def b_at_most_a(controls: dict) -> None:
        controls["b"].max = controls["a"].value

    c = {"a": widgets.IntSlider(value=4, min=1, max=9), "b": widgets.IntSlider(value=2, min=1, max=9)}
    box = explorers.live_explorer("t", draw, c, {"a": [1, 4]}, adjust=b_at_most_a)
    assert c["b"].max == 4 and drawn == [(4, 2)]
    c["a"].value = 1  # adjust first (b is clamped to 1, itself a move), then the frame of the new setting
    assert c["b"].max == 1 and drawn[-1] == (1, 1)
    assert box.children[-1].value == explorers.rows_html(draw(1, 1))
    assert list(box.children[0].children) == [c["a"], c["b"]]
    _, shown, grid, fixed, start = box._static.__wrapped__.args
    assert shown is draw and grid == {"a": [1, 4]} and fixed == {"b": 2} and start == {"a": 4}


def test_live_explorer_holds_a_fixed_argument_in_both_views_without_a_control() -> None:
    widgets = pytest.importorskip("ipywidgets")
    pytest.importorskip("plotly")

    def draw(a: int = 1, unit: float = 2.0) -> list[tuple[str, str]]:
        return [("a", str(a)), ("unit", str(unit))]

    c = {"a": widgets.IntSlider(value=4, min=1, max=9), "unit": widgets.fixed(1.0)}
    box = explorers.live_explorer("t", draw, c, {"a": [1, 4]}, [widgets.HBox([c["a"]])])
    assert box.children[-1].value == explorers.rows_html(draw(4, 1.0))  # the live view passes it
    assert list(box.children[0].children) == [c["a"]]
    _, _, _, fixed, _ = box._static.__wrapped__.args
    assert fixed == {"unit": 1.0}
    assert "held at unit = 1.0" in box._repr_mimebundle_()["text/html"]  # and the static note names it
