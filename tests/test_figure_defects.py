"""Figures a reader found wrong: chapter 7's breakdown (one bar per configuration, the legend off the bars)
and chapter 4's timelines (the axis in units of $t_f$, typeset; labels legible on ZB-V's pale boxes)."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.patches import Rectangle

from distlab.memory.figures import BREAKDOWN, breakdown_figure
from distlab.pipeline.figures import zero_bubble_figure


def test_breakdown_draws_one_bar_per_configuration_and_the_legend_covers_none() -> None:
    fig = breakdown_figure()
    ax = fig.axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]
    assert len({round(b.get_x() + b.get_width() / 2, 6) for b in bars}) == len(BREAKDOWN) == 7
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(set(labels)) == len(labels) == 7, labels
    canvas = FigureCanvasAgg(fig)  # the figure comes detached from pyplot: give it a canvas to lay out
    canvas.draw()
    renderer = canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    assert not any(legend.overlaps(b.get_window_extent(renderer)) for b in bars), "the legend covers a bar"


def test_timelines_give_time_in_units_of_t_f_and_legible_labels() -> None:
    fig = zero_bubble_figure()
    for ax in fig.axes:
        assert "$t_f$" in ax.get_xlabel() and "(t_f" not in ax.get_xlabel(), ax.get_xlabel()
    zbv = fig.axes[-1]
    pale = [t for t in zbv.texts if t.get_color() == "black"]
    assert pale, "the labels on ZB-V's paler second-chunk boxes must be dark, not white on pale"


def test_lab7s_static_explorer_names_the_settings_it_holds_and_never_rounds_to_zero() -> None:
    from distlab.explorers import frame_json, static_html
    from distlab.memory.figures import estimator_frame

    grid = {"dp": [1, 16, 128], "zero": [0, 1, 2, 3], "recompute": ["none", "selective", "full"]}
    held = {"tp": 8, "pp": 8, "schedule": "1f1b", "micro_batch": 1, "offload": False}
    text = static_html("memory-estimator", estimator_frame, grid, held)
    assert ("the other settings are held at tp = 8, pp = 8, schedule = 1f1b, micro_batch = 1, offload = no"
            in text), text[:400]
    frames = frame_json(text)["layout"]["meta"]["frames"]
    zero3_dp128 = dict(zip(*frames["2,3,1"], strict=True))
    assert zero3_dp128["params"] == "0.044 GB", zero3_dp128
