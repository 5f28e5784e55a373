"""Pictures of how the algorithms run, step by step: the ring, the binomial tree, recursive doubling and
the two-level all-reduce.

The ring pictures draw `ring_all_reduce_trace`, which replays the schedule that `ring_all_reduce` runs
(Patarasuk & Yuan 2009); the tree, recursive-doubling and two-level pictures draw the rounds of Thakur,
Rabenseifner & Gropp 2005 as `traces` computes them. So a wrong schedule draws a wrong picture. The buffer
grid and the palette come from `semantics.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from distlab.collectives.figures.semantics import _grid
from distlab.collectives.ring import REDUCE_SCATTER
from distlab.collectives.traces import (
    _check_p,
    binomial_broadcast_steps,
    hierarchical_all_reduce_trace,
    recursive_doubling_steps,
    recursive_doubling_trace,
    ring_all_reduce_trace,
)
from distlab.explorers import live_explorer
from distlab.style import BLUE, LINES, RC, SKY_BLUE, done

if TYPE_CHECKING:
    import ipywidgets


def _margin_arrows(ax: Axes, x: float, ys: Sequence[float], sends: Sequence[tuple[int, int]]) -> None:
    """Arcs in the right margin from row src to row dst (a two-way pair is one double-headed arc)."""
    for src, dst in sends:
        if (dst, src) in sends and dst < src:
            continue
        style = "<|-|>" if (dst, src) in sends else "-|>"
        rad = (0.55 if ys[dst] > ys[src] else -0.55) * min(1.0, 1.6 / max(1.0, abs(ys[dst] - ys[src])))
        ax.add_patch(FancyArrowPatch((x + 0.02, ys[src]), (x + 0.02, ys[dst]), arrowstyle=style,
                                     connectionstyle=f"arc3,rad={rad:.3f}", mutation_scale=10, lw=1.3,
                                     color="0.2", shrinkA=3, shrinkB=3))


def _ring_panel(ax: Axes, schedule: list, states: list, k: int, arrows: bool) -> None:
    p, rs_steps = len(states[0]), sum(step[0].phase == REDUCE_SCATTER for step in schedule)
    if not arrows:
        _ring_state_panel(ax, states[k], k == rs_steps)
        return
    step = schedule[k]
    phase = step[0].phase
    number = k + 1 if phase == "reduce-scatter" else k + 1 - rs_steps
    verb = "adds it" if phase == "reduce-scatter" else "copies it"
    ys = _grid(ax, states[k], f"{phase} step {number} of {p - 1}: the receiver {verb}",
               bold={(r, s.send_chunk) for r, s in enumerate(step)}, right=0.75)
    _margin_arrows(ax, p, ys, [(r, s.send_to) for r, s in enumerate(step)])


def _ring_state_panel(ax: Axes, rows: list, after_reduce_scatter: bool) -> None:
    """The buffers after a phase, without arrows; after reduce-scatter the full sums in thick borders."""
    p = len(rows)
    full = {(r, c) for r in range(p) for c in range(p) if rows[r][c] is not None and len(rows[r][c]) == p}
    title = ("after reduce-scatter: rank r holds one full sum" if after_reduce_scatter
             else "after all-gather: every chunk is the full sum")
    _grid(ax, rows, title, bold=full if after_reduce_scatter else set(), right=0.75)


def ring_all_reduce_steps_figure(p: int = 4) -> Figure:
    """Every step of ring all-reduce: reduce-scatter steps on the left, all-gather steps on the right.

    Each panel shows the state before the step: a thick border marks the chunk each rank sends, an arrow
    points to the receiver, and the letters and coloured stripes name the ranks whose data a chunk sums.
    """
    schedule, states = ring_all_reduce_trace(p)
    with mpl.rc_context(RC):
        if p == 1:
            fig, ax = plt.subplots(figsize=(3.5, 1.3), layout="constrained")
            _grid(ax, states[0], "p = 1: the vector is already the sum; nothing is sent", right=0.3)
            return done(fig)
        fig, axes = plt.subplots(p, 2, figsize=(7.2, (0.42 * p + 0.6) * p), squeeze=False,
                                 layout="constrained")
        fig.get_layout_engine().set(hspace=0.04, wspace=0.04)
        for j in range(p):
            _ring_panel(axes[j, 0], schedule, states, j, arrows=j < p - 1)
            _ring_panel(axes[j, 1], schedule, states, p - 1 + j, arrows=j < p - 1)
        fig.suptitle(f"Ring all-reduce on p = {p} ranks (Patarasuk & Yuan 2009). c0..c{p - 1}: chunks; thick "
                     "border: the chunk a rank sends\nin this step; arrow: to whom; letters and stripes: the "
                     "ranks whose data the chunk sums",
                     x=0.02, ha="left", fontsize=9)
    return done(fig)


def ring_all_reduce_step_figure(p: int = 4, step: int = 0) -> Figure:
    """One step of `ring_all_reduce_steps_figure`: step 0 .. 2(p-1) - 1, or 2(p-1) for the final state."""
    schedule, states = ring_all_reduce_trace(p)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= len(schedule):
        raise ValueError(f"step={step!r} must be an integer from 0 to {len(schedule)} for p={p} "
                         f"({len(schedule)} steps, then the final state)")
    with mpl.rc_context(RC):
        fig, ax = plt.subplots(figsize=(5.0, 0.45 * p + 0.9), layout="constrained")
        _ring_panel(ax, schedule, states, step, arrows=step < len(schedule))
    return done(fig)


RING_GRID_P = (3, 4)  # the static explorer's values of p (the widget offers 1 to 8)


def ring_all_reduce_frame(p: int = 4, step: int = 0) -> Figure:
    """What the ring explorer shows for p ranks at `step` (past the last step: the final state)."""
    return ring_all_reduce_step_figure(p, min(step, 2 * (p - 1)))


def ring_all_reduce_explorer(p: int = 4) -> ipywidgets.VBox:
    """A widget: pick p and a step, see that step of ring all-reduce (the same trace as the book figure)."""
    import ipywidgets as widgets

    ranks = widgets.Dropdown(options=list(range(1, 9)), value=_check_p(p, "p", 1), description="ranks p")
    controls = {"p": ranks, "step": widgets.IntSlider(value=0, min=0, max=2 * (p - 1), description="step")}

    def steps_of_this_ring(c: dict) -> None:
        c["step"].max = 2 * (c["p"].value - 1)

    return live_explorer("ring-all-reduce", ring_all_reduce_frame, controls,
                         {"p": RING_GRID_P, "step": list(range(2 * (max(RING_GRID_P) - 1) + 1))},
                         adjust=steps_of_this_ring)



def _timeline_axes(ax: Axes, p: int, columns: list[str]) -> None:
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks([-r for r in range(p)], [f"rank {r}" for r in range(p)])
    ax.set_xlim(-0.4, len(columns) - 0.6)
    ax.set_ylim(-p + 0.4, 0.6)
    ax.set_xlabel("round (time runs to the right)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)


def _arrow(ax: Axes, a: tuple[float, float], b: tuple[float, float], colour: str, style: str = "-|>") -> None:
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=11, lw=1.4, color=colour,
                                 shrinkA=7, shrinkB=7, zorder=2))


def _tree_positions(steps: list, p: int, root: int) -> dict[int, tuple[float, float]]:
    """Where each rank sits in the drawing of the tree: leaves left to right, parents above their children."""
    children: dict[int, list[int]] = {r: [] for r in range(p)}
    for pairs in steps:
        for src, dst in pairs:
            children[src].append(dst)
    pos: dict[int, tuple[float, float]] = {}

    def place(node: int, depth: int) -> float:
        xs = [place(c, depth + 1) for c in children[node]]
        pos[node] = (sum(xs) / len(xs) if xs else float(len([n for n in pos if not children[n]])), -depth)
        return pos[node][0]

    place(root, 0)
    return pos


def _draw_tree(tree: Axes, steps: list, pos: dict[int, tuple[float, float]], colour: dict[int, str],
               root: int) -> None:
    """Panel (a): the tree's edges coloured by round, and the ranks as numbered circles."""
    for k, pairs in enumerate(steps):
        for src, dst in pairs:
            tree.plot(*zip(pos[src], pos[dst], strict=True), color=colour[dst], lw=2, zorder=1,
                      label=f"round {k + 1}" if (src, dst) == pairs[0] else None)
    for r, (x, y) in pos.items():
        tree.scatter([x], [y], s=330, c="white", edgecolors="black", zorder=3)
        tree.text(x, y, str(r), ha="center", va="center", zorder=4)
    tree.set_title(f"(a) the tree rooted at rank {root}", loc="left")
    if steps:
        tree.legend(loc="upper left", frameon=False, borderaxespad=0)
    tree.axis("off")
    tree.margins(0.12)


def _draw_holders(time: Axes, steps: list, colour: dict[int, str], p: int, root: int) -> None:
    """Panel (b): round by round, the messages and which ranks hold the data."""
    have = {root}
    columns = ["start"] + [f"round {k + 1}" for k in range(len(steps))]
    for k in range(len(steps) + 1):
        if k:
            for src, dst in steps[k - 1]:
                _arrow(time, (k - 1, -src), (k, -dst), colour[dst])
            have |= {dst for _, dst in steps[k - 1]}
        time.scatter([k] * p, [-r for r in range(p)], s=110, zorder=3, edgecolors="0.3",
                     c=[BLUE if r in have else "white" for r in range(p)])
    _timeline_axes(time, p, columns)
    time.set_title("(b) filled = holds the data", loc="left")


def binomial_tree_figure(p: int = 8, root: int = 0) -> Figure:
    """Binomial-tree broadcast: (a) the tree, edges coloured by round; (b) who holds the data when."""
    steps = binomial_broadcast_steps(_check_p(p, "p", 1), root)
    pos = _tree_positions(steps, p, root)
    colour = {dst: LINES[k % len(LINES)] for k, pairs in enumerate(steps) for _, dst in pairs}
    with mpl.rc_context(RC):
        fig, (tree, time) = plt.subplots(1, 2, figsize=(7.2, 0.33 * p + 1.6), layout="constrained",
                                         gridspec_kw={"width_ratios": [1, 1.3]})
        _draw_tree(tree, steps, pos, colour, root)
        _draw_holders(time, steps, colour, p, root)
        fig.suptitle(f"Binomial-tree broadcast on p = {p} ranks: {len(steps)} = ceil(log2 p) rounds "
                     "(Thakur et al. 2005)", x=0.02, ha="left", fontsize=9.5)
    return done(fig)


def _draw_partners(ax: Axes, rounds: list) -> None:
    """One arrow per message of each round (both ways for an exchange), coloured by round."""
    for k, (kind, pairs) in enumerate(rounds, 1):
        for a, b in pairs:
            _arrow(ax, (k - 1, -a), (k, -b), LINES[(k - 1) % len(LINES)])
            if kind == "exchange":
                _arrow(ax, (k - 1, -b), (k, -a), LINES[(k - 1) % len(LINES)])


def _draw_sums(ax: Axes, states: list, folded: set[int], p: int) -> None:
    """Each rank after each round: a circle with how many ranks its vector sums ("–" while folded away)."""
    for k, state in enumerate(states):
        idle = {r for r in folded if 0 < k < len(states) - 1}
        for r, cell in enumerate(state):
            n = len(cell or ())
            fill = "white" if r in idle else BLUE if n == p else SKY_BLUE
            ax.scatter([k], [-r], s=260, c=fill, edgecolors="0.3", zorder=3)
            ax.text(k, -r, "–" if r in idle else str(n), ha="center", va="center", zorder=4,
                    color="white" if fill == BLUE else "black", fontsize=8)


def recursive_doubling_figure(p: int = 8) -> Figure:
    """Recursive-doubling all-reduce: who pairs with whom in each round; the number in a circle is how
    many ranks' vectors that rank's vector sums. Non-powers of two fold in first and unfold last."""
    rounds = recursive_doubling_steps(_check_p(p, "p", 1))
    states = recursive_doubling_trace(p)
    folded = {a for kind, pairs in rounds if kind == "fold" for a, _ in pairs}
    columns = ["start"] + [kind if kind != "exchange" else f"step {k}" for k, (kind, _) in
                           enumerate(rounds, 0 if folded else 1)]
    with mpl.rc_context(RC):
        fig, ax = plt.subplots(figsize=(7.2, 0.42 * p + 1.3), layout="constrained")
        _draw_partners(ax, rounds)
        _draw_sums(ax, states, folded, p)
        _timeline_axes(ax, p, columns)
        note = "" if not folded else (f"; p is not a power of two, so ranks {sorted(folded)} fold their "
                                      "vectors into a partner first and get the result back last")
        ax.set_title(f"Recursive-doubling all-reduce on p = {p} ranks (Thakur et al. 2005): partners swap "
                     f"and add\nnumber = ranks summed so far, dark = all {p}{note}", loc="left", wrap=True)
    return done(fig)


def hierarchical_all_reduce_figure(nodes: int = 2, ranks_per_node: int = 4) -> Figure:
    """The phases of the two-level all-reduce: each rank's vector after the phase, the phase's messages
    as arrows, nodes as shaded bands, the ranks holding the phase's result with thick borders."""
    phases = hierarchical_all_reduce_trace(nodes, ranks_per_node)
    q, p = ranks_per_node, nodes * ranks_per_node
    ys = [-(g + 0.45 * (g // q)) for g in range(p)]
    with mpl.rc_context(RC):
        fig, axes = plt.subplots(1, 4, figsize=(7.2, 0.36 * p + 1.5), sharey=True, layout="constrained")
        for i, (ax, (title, rows, sends)) in enumerate(zip(axes, phases, strict=True)):
            result = {g for g in range(p) if g % q == 0} if i in (1, 2) else set(range(p) if i == 3 else ())
            _grid(ax, rows, title, ys=ys, bold={(g, 0) for g in result}, right=1.0, fs=7.5, headers=False,
                  faded=set(range(p)) - result if i in (1, 2) else set())
            _margin_arrows(ax, 1.0, ys, sends)
            for n in range(nodes):
                top, bottom = ys[n * q] + 0.5, ys[n * q + q - 1] - 0.5
                ax.add_patch(Rectangle((-0.05, bottom), 1.95, top - bottom, fc="0.93", ec="none", zorder=0))
                ax.text(1.9, bottom + 0.1, f"node {n}", ha="right", va="bottom", fontsize=7, color="0.35")
        fig.suptitle(f"Two-level all-reduce on {nodes} nodes x {q} ranks (hierarchical_all_reduce): only "
                     "the leaders' ring crosses nodes.\nGrey: vectors no longer needed; thick border: holds "
                     "the phase's result; arrows: the phase's messages",
                     x=0.02, ha="left", fontsize=9.5)
    return done(fig)
