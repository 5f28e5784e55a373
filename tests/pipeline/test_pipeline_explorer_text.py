"""Lab 4's explorer text and its static version agree (issue 38, D17): what the text asks to try (m < p,
t_b/t_f = 1, the interleaved schedule with a transfer of 0.3 t_f) is in the static grid the book shows,
and a frame of a schedule with one chunk per rank does not claim the held v."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distlab.pipeline.figures import pipeline_frame

LAB = Path(__file__).resolve().parents[2] / "labs" / "04_pipeline.ipynb"


def _static_grid() -> tuple[dict, dict]:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("plotly")
    from distlab.pipeline.figures import pipeline_explorer

    _, _, grid, held, _ = pipeline_explorer()._static.__wrapped__.args
    return grid, held


def test_the_static_explorer_has_what_the_lab_asks_to_try() -> None:
    grid, held = _static_grid()
    text = next("".join(c["source"]) for c in json.loads(LAB.read_text())["cells"]
                if "## 5 · Explore" in "".join(c["source"]))
    assert "$m < p$" in text and "$t_b / t_f = 1$" in text and "$0.3\\,t_f$" in text
    assert min(grid["m"]) < held["p"], "the text asks for m < p"
    assert 1.0 in grid["tb"] and 0.3 in grid["tcomm"] and {"interleaved", "1f1b"} <= set(grid["schedule"])
    held_text = f"holds $p = {held['p']}$ and $v = {held['v']}$"
    assert held_text in text, "the text names what the static view holds"
    for name in ("m", "tb", "tcomm"):
        assert name in grid, f"the text says the static version moves {name}"


@pytest.mark.parametrize("schedule, shown", [("1f1b", "one chunk per rank"), ("gpipe", "one chunk per rank"),
                                             ("interleaved", "v=2")])
def test_a_frame_says_how_many_chunks_its_schedule_has(schedule: str, shown: str) -> None:
    """The static caption holds v = 2; a 1F1B frame used to say "v=1" beside it."""
    fig = pipeline_frame(schedule, p=4, m=8, v=2, tb=1.0, tcomm=0.3)
    titles = " ".join([ax.get_title() for ax in fig.axes] + [t.get_text() for t in fig.texts])
    assert shown in titles and "t_b/t_f=1" in titles and "transfer 0.3 t_f" in titles, titles
    assert schedule == "interleaved" or "v=" not in titles
