"""Chapter 1's figures: the symbolic semantics and traces they are drawn from, what each figure shows,
and that the book's registry draws them."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest

from distlab import figures as book
from distlab.collectives import cost_model
from distlab.collectives import figures as F
from distlab.collectives import traces as T
from distlab.collectives.figures import semantics
from distlab.collectives.ring import REDUCE_SCATTER, RingStep, ring_all_reduce_schedule

# The file names the book includes (.plan/LAYOUT.md, "Book figures").
CHAPTER_1_FILES = {f"semantics-{c}.png" for c in ("broadcast", "scatter", "gather", "reduce", "all_reduce",
                                                   "all_gather", "reduce_scatter", "all_to_all")} | {
    "ring-all-reduce-steps.png", "binomial-tree-broadcast.png", "recursive-doubling.png",
    "hierarchical-all-reduce.png", "cost-model-algorithms.png"}



def full(p: int) -> tuple[str, ...]:
    return tuple(T.letter(r) for r in range(p))


def cell_texts(ax) -> dict[tuple[float, float], str]:
    """The labels drawn in an axes' cells, by their (x, y) data position."""
    return {(round(t.get_position()[0], 2), round(t.get_position()[1], 2)): t.get_text() for t in ax.texts}


# --- apply_semantics, checked by hand --------------------------------------------------------------

@pytest.mark.parametrize("collective, buffers, root, expected", [
    ("broadcast", [[None], ["b"], [None]], 1, [[("b",)], [("b",)], [("b",)]]),
    ("scatter", [["a0", "a1", "a2"], [None], [None]], 0, [[("a0",)], [("a1",)], [("a2",)]]),
    ("gather", [["a"], ["b"], ["c"]], 1, [[], [("a",), ("b",), ("c",)], []]),
    ("reduce", [["a0", "a1"], ["b0", "b1"]], 0, [[("a0", "b0"), ("a1", "b1")], []]),
    ("all_reduce", [["a0", "a1"], ["b0", "b1"]], 0, [[("a0", "b0"), ("a1", "b1")]] * 2),
    ("all_gather", [["a"], ["b"]], 0, [[("a",), ("b",)], [("a",), ("b",)]]),
    ("reduce_scatter", [["a0", "a1"], ["b0", "b1"]], 0, [[("a0", "b0")], [("a1", "b1")]]),
    ("all_to_all", [["a0", "a1", "a2"], ["b0", "b1", "b2"], ["c0", "c1", "c2"]], 0,
     [[("a0",), ("b0",), ("c0",)], [("a1",), ("b1",), ("c1",)], [("a2",), ("b2",), ("c2",)]]),
])
def test_apply_semantics(collective, buffers, root, expected):
    assert T.apply_semantics(collective, buffers, root) == expected


def test_sums_keep_every_term_and_compare_exactly():
    twice = T.apply_semantics("all_reduce", [[("a", "b")], ["a"]])
    assert twice == [[("a", "a", "b")], [("a", "a", "b")]]  # a counted twice stays visible
    swapped = T.apply_semantics("reduce_scatter", [["b1", "b0"], ["a1", "a0"]])
    assert swapped == [[("a1", "b1")], [("a0", "b0")]]


@pytest.mark.parametrize("args, message", [
    (("allreduce", [["a"]]), "collective='allreduce' is not known; choose one of broadcast, scatter"),
    (("broadcast", [["a"], ["b"]], 2), "root=2 is not one of the 2 ranks; choose a root in 0..1"),
    (("scatter", [["a", "b"], [None], [None]]), "scatter splits a buffer of 2 cells into 3 equal chunks"),
    (("reduce", [["a"], ["b", "c"]]), "reduce adds buffers element by element, so they must be of equal "
                                      "length; got lengths [1, 2]"),
    (("all_gather", []), "buffers=[] holds no rank"),
])
def test_apply_semantics_errors_name_the_problem(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        T.apply_semantics(*args)


# --- the traces the pictures are drawn from ---------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_ring_trace_ends_fully_reduced_and_moves_one_chunk_per_rank_per_step(p):
    schedule, states = T.ring_all_reduce_trace(p)
    assert len(schedule) == 2 * (p - 1) and len(states) == len(schedule) + 1
    assert states[-1] == [[full(p)] * p for _ in range(p)]  # every chunk on every rank: each rank once
    for k, step in enumerate(schedule):
        assert len(step) == p  # one RingStep (one chunk sent, one received) per rank
        assert sorted(s.send_to for s in step) == list(range(p))  # every rank receives exactly one chunk
        changed = [(r, c) for r in range(p) for c in range(p) if states[k + 1][r][c] != states[k][r][c]]
        assert changed == [(r, s.recv_chunk) for r, s in enumerate(step)]
        for r, s in enumerate(step):
            got = states[k + 1][r][s.recv_chunk]
            assert len(set(got)) == len(got)  # no rank's data is ever added twice
            if s.phase == REDUCE_SCATTER:  # after reduce step k the received chunk sums k + 2 ranks
                assert len(got) == k + 2
    if p > 1:  # after the reduce-scatter, rank i owns the full sum of chunk i (ring_reduce_scatter's layout)
        assert [states[p - 1][r][r] for r in range(p)] == [full(p)] * p


def test_a_wrong_schedule_draws_a_wrong_picture(monkeypatch):
    right = ring_all_reduce_schedule(3)
    monkeypatch.setattr(T, "ring_all_reduce_schedule", lambda p: right[:2])  # all-gather dropped
    _, states = T.ring_all_reduce_trace(3)
    assert states[-1] != [[full(3)] * 3] * 3
    bad = [[RingStep(REDUCE_SCATTER, 0, 1, 1, 1), RingStep(REDUCE_SCATTER, 0, 0, 0, 0)]]
    monkeypatch.setattr(T, "ring_all_reduce_schedule", lambda p: bad)
    with pytest.raises(ValueError, match="rank 0 expects chunk 1 from rank 1, which sends chunk 0 to rank 0"):
        T.ring_all_reduce_trace(2)


def test_binomial_broadcast_reaches_every_rank_once_from_a_holder():
    assert T.binomial_broadcast_steps(8) == [[(0, 4)], [(0, 2), (4, 6)], [(0, 1), (2, 3), (4, 5), (6, 7)]]
    for p in range(1, 12):
        for root in (0, p - 1):
            have, received = {root}, []
            for pairs in T.binomial_broadcast_steps(p, root):
                assert all(src in have for src, _ in pairs)
                received += [dst for _, dst in pairs]
                have |= {dst for _, dst in pairs}
            assert sorted(received) == sorted(set(range(p)) - {root})
            assert len(T.binomial_broadcast_steps(p, root)) == (p - 1).bit_length()


def test_recursive_doubling_pairs_and_non_powers_of_two():
    assert T.recursive_doubling_steps(8) == [
        ("exchange", [(0, 1), (2, 3), (4, 5), (6, 7)]), ("exchange", [(0, 2), (1, 3), (4, 6), (5, 7)]),
        ("exchange", [(0, 4), (1, 5), (2, 6), (3, 7)])]
    assert T.recursive_doubling_steps(6) == [
        ("fold", [(0, 1), (2, 3)]), ("exchange", [(1, 3), (4, 5)]), ("exchange", [(1, 4), (3, 5)]),
        ("unfold", [(1, 0), (3, 2)])]
    for p in range(1, 13):
        assert T.recursive_doubling_trace(p)[-1] == [full(p)] * p, p


def test_hierarchical_trace_follows_the_three_phases():
    phases = T.hierarchical_all_reduce_trace(2, 4)
    assert [len(rows) for _, rows, _ in phases] == [8] * 4
    (_, start, _), (_, one, up), (_, two, ring), (_, three, down) = phases
    assert one[0] == [("A", "B", "C", "D")] and one[4] == [("E", "F", "G", "H")] and one[1] == start[1]
    assert sorted(up) == sorted([(1, 0), (3, 2), (2, 0), (5, 4), (7, 6), (6, 4)])
    assert ring == [(0, 4), (4, 0)] and two[0] == two[4] == [full(8)]
    assert three == [[full(8)]] * 8 and sorted(down) == sorted((b, a) for a, b in up)


# --- the figures ------------------------------------------------------------------------------------

@pytest.mark.parametrize("collective", T.COLLECTIVES)
def test_semantics_figure_draws_the_computed_after(collective):
    fig = F.semantics_figure(collective, p=4)
    before, after = fig.axes
    assert before.get_title(loc="left") == "before" and after.get_title(loc="left") == "after"
    assert collective in fig._suptitle.get_text()
    rows = T.apply_semantics(collective, T.example_buffers(collective, 4))
    texts = cell_texts(after)
    for r, row in enumerate(rows):
        drawn = [texts[(c + 0.46, -float(r))] for c in range(len(row))]
        assert [d.replace("\n", "") for d in drawn] == ["+".join(t.translate(semantics._SUB) for t in cell)
                                                        for cell in row]


def test_semantics_figure_cells_by_hand():
    after = F.semantics_figure("all_to_all").axes[1]
    texts = cell_texts(after)
    assert [texts[(c + 0.46, -1.0)] for c in range(4)] == ["A₁", "B₁", "C₁", "D₁"]  # everyone's chunk 1
    after = F.semantics_figure("reduce_scatter").axes[1]
    assert cell_texts(after)[(0.46, -2.0)] == "A₂+B₂\n+C₂+D₂"
    assert "(root)" in F.semantics_figure("gather").axes[0].get_yticklabels()[0].get_text()


def test_ring_steps_figure_has_a_panel_per_step_and_marks_the_sends():
    fig = F.ring_all_reduce_steps_figure(4)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert len(fig.axes) == 8
    assert titles[0:2] == ["reduce-scatter step 1 of 3: the receiver adds it",
                           "all-gather step 1 of 3: the receiver copies it"]
    assert titles[-2:] == ["after reduce-scatter: rank r holds one full sum",
                           "after all-gather: every chunk is the full sum"]
    thick = [sum(1 for patch in ax.patches if patch.get_linewidth() > 2) for ax in fig.axes]
    assert thick == [4, 4, 4, 4, 4, 4, 4, 0]  # a sent chunk per rank per step; the owned sums; nothing
    assert len(F.ring_all_reduce_steps_figure(1).axes) == 1
    assert F.ring_all_reduce_step_figure(3, 4).axes[0].get_title(loc="left").startswith("after all-gather")
    with pytest.raises(ValueError, match=r"step=5 must be an integer from 0 to 4 for p=3"):
        F.ring_all_reduce_step_figure(3, 5)


def test_tree_doubling_and_hierarchical_figures():
    tree, timeline = F.binomial_tree_figure(8).axes
    assert sorted(int(t.get_text()) for t in tree.texts) == list(range(8))
    assert [t.get_text() for t in tree.get_legend().get_texts()] == ["round 1", "round 2", "round 3"]
    assert [t.get_text() for t in timeline.get_xticklabels()] == ["start", "round 1", "round 2", "round 3"]
    (rd,) = F.recursive_doubling_figure(6).axes
    assert [t.get_text() for t in rd.get_xticklabels()] == ["start", "fold", "step 1", "step 2", "unfold"]
    assert [t.get_text() for t in rd.texts][-6:] == ["6"] * 6  # every rank ends with all 6 contributions
    (rd8,) = F.recursive_doubling_figure(8).axes
    assert [t.get_text() for t in rd8.get_xticklabels()] == ["start", "step 1", "step 2", "step 3"]
    hier = F.hierarchical_all_reduce_figure(2, 4)
    assert [ax.get_title(loc="left").split("\n")[0] for ax in hier.axes] == [
        "before", "1. reduce to each", "2. all-reduce among", "3. broadcast from"]
    assert sum(t.get_text() == "Σ A–H" for t in hier.axes[3].texts) == 8


def test_cost_model_figure_plots_the_predictions():
    params = cost_model.MachineParams(alpha=5e-6, beta=1e-10, gamma=2e-11)
    sizes = np.logspace(2, 8, 7)
    ax = F.cost_model_figure(params, 8, sizes, ranks_per_node=4, note="Example: ").axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "bytes" in ax.get_xlabel() and "(s)" in ax.get_ylabel()
    assert ax.get_title(loc="left").startswith("Example: p = 8, α = 5 µs, 1/β = 10 GB/s")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"ring", "recursive doubling", "binomial tree reduce + broadcast",
                          "two-level, 4 ranks per node", "lower bound (no algorithm reaches it everywhere)"}
    ring = cost_model.predict("ring_all_reduce", sizes, 8, params)
    np.testing.assert_allclose(lines["ring"].get_ydata(), ring)
    with pytest.raises(ValueError, match="sizes must be at least two message sizes > 0 bytes"):
        F.cost_model_figure(params, 8, [0, 10])


def test_explorer_constructs_and_follows_p():
    import ipywidgets

    box = F.ring_all_reduce_explorer(4)
    assert isinstance(box, ipywidgets.VBox)
    ranks, step = box.children[0].children
    assert (ranks.value, step.max) == (4, 6)
    ranks.value = 3
    assert step.max == 4


def test_figures_leave_global_state_alone():
    before = dict(matplotlib.rcParams)
    F.semantics_figure("all_reduce")
    F.ring_all_reduce_steps_figure(2)
    assert dict(matplotlib.rcParams) == before
    assert plt.get_fignums() == []  # every figure was detached from pyplot


@pytest.mark.parametrize("call, message", [
    (lambda: F.semantics_figure("all_reduce", p=9), "p=9 must be an integer from 1 to 8"),
    (lambda: F.hierarchical_all_reduce_figure(0, 4), "nodes=0 must be an integer from 1 to 8"),
    (lambda: F.binomial_tree_figure(4, root=4), "root=4 is not one of the 4 ranks"),
])
def test_figure_arguments_are_checked(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


# --- in the book ------------------------------------------------------------------------------------

def test_chapter_1_figures_are_registered_and_included():
    names = {f.filename for f in book.BOOK_FIGURES}
    assert CHAPTER_1_FILES <= names
    page = (Path(__file__).resolve().parents[2] / "book" / "01-collectives.md").read_text()
    assert CHAPTER_1_FILES == set(re.findall(r"figures/([\w.-]+\.png)", page))
