"""Pictures of chapter 1's collectives, drawn from the symbolic traces in `traces`.

Nothing here is drawn by hand and nothing here decides what a collective does. The "after" half of each
semantics picture is `apply_semantics` (MPI Forum 2021, "MPI: A Message-Passing Interface Standard 4.0",
ch. 6) of its "before" half; the ring pictures draw `ring_all_reduce_trace`, which replays the schedule that
`ring_all_reduce` runs (Patarasuk & Yuan 2009); the tree, recursive-doubling and two-level pictures draw the
rounds of Thakur, Rabenseifner & Gropp 2005 as `traces` computes them. So a wrong schedule draws a wrong
picture.

Every function returns a matplotlib Figure and leaves global state alone: rcParams change only inside
`mpl.rc_context`, and each figure is closed in pyplot before it is returned (a notebook shows it once,
`fig.savefig` still works). Colours: the Okabe & Ito (2008) palette, safe for colour-blind readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from distlab.collectives import cost_model
from distlab.collectives.ring import REDUCE_SCATTER
from distlab.collectives.traces import (
    Cell,
    _check_p,
    apply_semantics,
    binomial_broadcast_steps,
    example_buffers,
    hierarchical_all_reduce_trace,
    recursive_doubling_steps,
    recursive_doubling_trace,
    ring_all_reduce_trace,
)

if TYPE_CHECKING:
    import ipywidgets

OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999")
_LINES = ("#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7", "#000000")
_RC = MappingProxyType({"font.size": 8.5, "axes.titlesize": 9, "axes.labelsize": 8.5, "legend.fontsize": 8,
                        "font.family": "DejaVu Sans", "savefig.dpi": 150})
_SUB = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
_DOING = MappingProxyType({"broadcast": "the root's buffer is copied to every rank",
          "scatter": "the root's chunk i goes to rank i",
          "gather": "rank i's buffer goes to slot i on the root",
          "reduce": "the element-wise sum of all buffers lands on the root",
          "all_reduce": "every rank gets the element-wise sum of all buffers",
          "all_gather": "every rank gets every rank's buffer, in rank order",
          "reduce_scatter": "rank i gets the sum of everyone's chunk i",
          "all_to_all": "rank i's chunk j goes to slot i on rank j"})


def _label(cell: Cell) -> str:
    """"A₀+B₀" for short sums (two lines past two terms), "Σ A–H" for long ones."""
    if cell is None:
        return ""
    terms = [t.translate(_SUB) for t in cell]
    suffixes = {t[1:] for t in cell}
    if len(cell) <= 4 or len(set(cell)) < len(cell) or len(suffixes) > 1:
        half = 2 if len(terms) > 2 else len(terms)
        return "+".join(terms[:half]) + ("\n+" + "+".join(terms[half:]) if terms[half:] else "")
    codes = sorted(ord(t[0]) for t in cell)
    runs: list[list[int]] = []
    for c in codes:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    text = ",".join(f"{chr(r[0])}–{chr(r[-1])}" if len(r) > 2 else ",".join(map(chr, r)) for r in runs)
    suffix = suffixes.pop().translate(_SUB)
    return f"Σ({text}){suffix}" if suffix else f"Σ {text}"


def _colour(term: str) -> str:
    return OKABE_ITO[(ord(term[0]) - ord("A")) % len(OKABE_ITO)]


def _draw_cell(ax: Axes, x: float, y: float, cell: Cell, bold: bool = False, fs: float = 8.0,
               faded: bool = False) -> None:
    w, h = 0.92, 0.8
    if cell is None:
        ax.add_patch(Rectangle((x, y - h / 2), w, h, fill=False, ec="0.6", lw=0.8, ls=(0, (2, 2))))
        return
    for k, term in enumerate(cell):  # one stripe per contribution, in its rank's colour
        ax.add_patch(Rectangle((x + k * w / len(cell), y - h / 2), w / len(cell), h, fc=_colour(term),
                               alpha=0.2 if faded else 0.55, lw=0))
    ax.add_patch(Rectangle((x, y - h / 2), w, h, fill=False, ec="0.6" if faded else "black",
                           lw=2.6 if bold else 0.8))
    ax.text(x + w / 2, y, _label(cell), ha="center", va="center", fontsize=fs, linespacing=0.95,
            color="0.45" if faded else "black")


def _grid(ax: Axes, rows: Sequence[Sequence[Cell]], title: str, ys: Sequence[float] | None = None,
          bold: set[tuple[int, int]] = frozenset(), headers: bool = True, right: float = 0.05,
          fs: float = 8.0, ncols: int | None = None, faded: set[int] = frozenset(),
          names: Sequence[str] | None = None) -> list[float]:
    """Draw rank r's buffer as row r (rank 0 on top), chunk c as column c; return the rows' y positions.

    bold: (rank, chunk) cells to outline; faded: ranks whose buffer no longer matters; names: row labels.
    """
    ys = list(ys) if ys is not None else [-float(r) for r in range(len(rows))]
    ncols = ncols or max([1] + [len(b) for b in rows])
    for r, (buf, y) in enumerate(zip(rows, ys, strict=True)):
        if not buf:
            ax.text(0.05, y, "(no output)", va="center", color="0.4", fontsize=fs, style="italic")
        for c, cell in enumerate(buf):
            _draw_cell(ax, c, y, cell, (r, c) in bold, fs, r in faded)
    ax.set_xlim(-0.06, ncols + right)
    ax.set_ylim(min(ys) - 0.55, max(ys) + 0.55)
    ax.set_yticks(ys, names if names is not None else [f"rank {r}" for r in range(len(rows))])
    ax.set_xticks([c + 0.46 for c in range(ncols)] if headers else [],
                  [f"c{c}" for c in range(ncols)] if headers else [])
    ax.xaxis.tick_top()
    ax.tick_params(length=0, pad=2)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title, loc="left")
    return ys


def _done(fig: Figure) -> Figure:
    plt.close(fig)  # detach from pyplot: no second copy in notebooks, no figures piling up in scripts
    return fig


def semantics_figure(collective: str, p: int = 4, root: int = 0) -> Figure:
    """Each rank's buffer before and after `collective`; the after is `apply_semantics` of the before."""
    before = example_buffers(collective, _check_p(p, "p", 1), root)
    after = apply_semantics(collective, before, root)
    rooted = collective in ("broadcast", "scatter", "gather", "reduce")
    names = [f"rank {r}" + (" (root)" if rooted and r == root else "") for r in range(p)]
    with mpl.rc_context(_RC):
        fig, axes = plt.subplots(1, 2, figsize=(7.2, 0.5 * p + 1.0), gridspec_kw={"wspace": 0.18})
        for ax, rows, when in zip(axes, (before, after), ("before", "after"), strict=True):
            _grid(ax, rows, when, ncols=max([p] + [len(b) for b in before + after]), headers=False,
                  names=names if ax is axes[0] else [""] * p)
        left, right = axes[0].get_position().x1, axes[1].get_position().x0
        fig.add_artist(FancyArrowPatch((left + 0.01, 0.5), (right - 0.005, 0.5), transform=fig.transFigure,
                                       arrowstyle="-|>", mutation_scale=18, lw=1.5, color="0.2"))
        fig.suptitle(f"{collective}: {_DOING[collective]}", x=0.02, y=0.99, ha="left", va="bottom",
                     fontsize=9.5)
    return _done(fig)


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
    rows = states[k]
    full = {(r, c) for r in range(p) for c in range(p) if rows[r][c] is not None and len(rows[r][c]) == p}
    if not arrows:
        title = ("after reduce-scatter: rank r holds one full sum" if k == rs_steps
                 else "after all-gather: every chunk is the full sum")
        _grid(ax, rows, title, bold=full if k == rs_steps else set(), right=0.75)
        return
    step = schedule[k]
    phase = step[0].phase
    number = k + 1 if phase == "reduce-scatter" else k + 1 - rs_steps
    verb = "adds it" if phase == "reduce-scatter" else "copies it"
    ys = _grid(ax, rows, f"{phase} step {number} of {p - 1}: the receiver {verb}",
               bold={(r, s.send_chunk) for r, s in enumerate(step)}, right=0.75)
    _margin_arrows(ax, p, ys, [(r, s.send_to) for r, s in enumerate(step)])


def ring_all_reduce_steps_figure(p: int = 4) -> Figure:
    """Every step of ring all-reduce: reduce-scatter steps on the left, all-gather steps on the right.

    Each panel shows the state before the step: a thick border marks the chunk each rank sends, an arrow
    points to the receiver, and the letters and coloured stripes name the ranks whose data a chunk sums.
    """
    schedule, states = ring_all_reduce_trace(p)
    with mpl.rc_context(_RC):
        if p == 1:
            fig, ax = plt.subplots(figsize=(3.5, 1.3), layout="constrained")
            _grid(ax, states[0], "p = 1: the vector is already the sum; nothing is sent", right=0.3)
            return _done(fig)
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
    return _done(fig)


def ring_all_reduce_step_figure(p: int = 4, step: int = 0) -> Figure:
    """One step of `ring_all_reduce_steps_figure`: step 0 .. 2(p-1) - 1, or 2(p-1) for the final state."""
    schedule, states = ring_all_reduce_trace(p)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= len(schedule):
        raise ValueError(f"step={step!r} must be an integer from 0 to {len(schedule)} for p={p} "
                         f"({len(schedule)} steps, then the final state)")
    with mpl.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(5.0, 0.45 * p + 0.9), layout="constrained")
        _ring_panel(ax, schedule, states, step, arrows=step < len(schedule))
    return _done(fig)


def ring_all_reduce_explorer(p: int = 4) -> ipywidgets.VBox:
    """A widget: pick p and a step, see that step of ring all-reduce (the same trace as the book figure)."""
    import ipywidgets as widgets
    from IPython.display import display

    ranks = widgets.Dropdown(options=list(range(1, 9)), value=_check_p(p, "p", 1), description="ranks p")
    step = widgets.IntSlider(value=0, min=0, max=2 * (p - 1), description="step")
    out = widgets.Output()

    def redraw(_: object = None) -> None:
        step.max = 2 * (ranks.value - 1)
        with out:
            out.clear_output(wait=True)
            display(ring_all_reduce_step_figure(ranks.value, min(step.value, step.max)))

    ranks.observe(redraw, names="value")
    step.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([ranks, step]), out])


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


def binomial_tree_figure(p: int = 8, root: int = 0) -> Figure:
    """Binomial-tree broadcast: (a) the tree, edges coloured by round; (b) who holds the data when."""
    steps = binomial_broadcast_steps(_check_p(p, "p", 1), root)
    children: dict[int, list[int]] = {r: [] for r in range(p)}
    for pairs in steps:
        for src, dst in pairs:
            children[src].append(dst)
    pos: dict[int, tuple[float, float]] = {}

    def place(node: int, depth: int) -> float:  # leaves left to right, parents above their children
        xs = [place(c, depth + 1) for c in children[node]]
        pos[node] = (sum(xs) / len(xs) if xs else float(len([n for n in pos if not children[n]])), -depth)
        return pos[node][0]

    place(root, 0)
    colour = {dst: _LINES[k % len(_LINES)] for k, pairs in enumerate(steps) for _, dst in pairs}
    with mpl.rc_context(_RC):
        fig, (tree, time) = plt.subplots(1, 2, figsize=(7.2, 0.33 * p + 1.6), layout="constrained",
                                         gridspec_kw={"width_ratios": [1, 1.3]})
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
        have = {root}
        columns = ["start"] + [f"round {k + 1}" for k in range(len(steps))]
        for k in range(len(steps) + 1):
            if k:
                for src, dst in steps[k - 1]:
                    _arrow(time, (k - 1, -src), (k, -dst), colour[dst])
                have |= {dst for _, dst in steps[k - 1]}
            time.scatter([k] * p, [-r for r in range(p)], s=110, zorder=3, edgecolors="0.3",
                         c=["#0072B2" if r in have else "white" for r in range(p)])
        _timeline_axes(time, p, columns)
        time.set_title("(b) filled = holds the data", loc="left")
        fig.suptitle(f"Binomial-tree broadcast on p = {p} ranks: {len(steps)} = ceil(log2 p) rounds "
                     "(Thakur et al. 2005)", x=0.02, ha="left", fontsize=9.5)
    return _done(fig)


def recursive_doubling_figure(p: int = 8) -> Figure:
    """Recursive-doubling all-reduce: who pairs with whom in each round; the number in a circle is how
    many ranks' vectors that rank's vector sums. Non-powers of two fold in first and unfold last."""
    rounds = recursive_doubling_steps(_check_p(p, "p", 1))
    states = recursive_doubling_trace(p)
    folded = {a for kind, pairs in rounds if kind == "fold" for a, _ in pairs}
    columns = ["start"] + [kind if kind != "exchange" else f"step {k}" for k, (kind, _) in
                           enumerate(rounds, 0 if folded else 1)]
    with mpl.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(7.2, 0.42 * p + 1.3), layout="constrained")
        for k, (kind, pairs) in enumerate(rounds, 1):
            for a, b in pairs:
                _arrow(ax, (k - 1, -a), (k, -b), _LINES[(k - 1) % len(_LINES)])
                if kind == "exchange":
                    _arrow(ax, (k - 1, -b), (k, -a), _LINES[(k - 1) % len(_LINES)])
        for k, state in enumerate(states):
            idle = {r for r in folded if 0 < k < len(states) - 1}
            for r, cell in enumerate(state):
                n = len(cell or ())
                fill = "white" if r in idle else "#0072B2" if n == p else "#56B4E9"
                ax.scatter([k], [-r], s=260, c=fill, edgecolors="0.3", zorder=3)
                ax.text(k, -r, "–" if r in idle else str(n), ha="center", va="center", zorder=4,
                        color="white" if fill == "#0072B2" else "black", fontsize=8)
        _timeline_axes(ax, p, columns)
        note = "" if not folded else (f"; p is not a power of two, so ranks {sorted(folded)} fold their "
                                      "vectors into a partner first and get the result back last")
        ax.set_title(f"Recursive-doubling all-reduce on p = {p} ranks (Thakur et al. 2005): partners swap "
                     f"and add\nnumber = ranks summed so far, dark = all {p}{note}", loc="left", wrap=True)
    return _done(fig)


def hierarchical_all_reduce_figure(nodes: int = 2, ranks_per_node: int = 4) -> Figure:
    """The phases of the two-level all-reduce: each rank's vector after the phase, the phase's messages
    as arrows, nodes as shaded bands, the ranks holding the phase's result with thick borders."""
    phases = hierarchical_all_reduce_trace(nodes, ranks_per_node)
    q, p = ranks_per_node, nodes * ranks_per_node
    ys = [-(g + 0.45 * (g // q)) for g in range(p)]
    with mpl.rc_context(_RC):
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
    return _done(fig)


def _si_bytes(x: float, _: object = None) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:g} {unit}"
    return f"{x:g} B"


def cost_model_figure(params: cost_model.MachineParams, p: int, sizes: Sequence[float] | None = None,
                      ranks_per_node: int | None = None, note: str = "") -> Figure:
    """Predicted all-reduce time against message size for each algorithm, `cost_model.predict` on log-log
    axes, with the lower bound of Chan et al. 2007. `note` prefixes the title (say where params come from)."""
    _check_p(p, "p", 2, 1 << 20)
    n = np.asarray(sizes if sizes is not None else np.logspace(1, 9, 65), dtype=np.float64)
    if n.ndim != 1 or len(n) < 2 or np.any(n <= 0):
        raise ValueError(f"sizes must be at least two message sizes > 0 bytes; got {sizes!r}")
    curves = [("ring", cost_model.predict("ring_all_reduce", n, p, params)),
              ("recursive doubling", cost_model.predict("recursive_doubling_all_reduce", n, p, params)),
              ("binomial tree reduce + broadcast", cost_model.predict("tree_reduce", n, p, params)
               + cost_model.predict("tree_broadcast", n, p, params))]
    if ranks_per_node is not None:
        curves.append((f"two-level, {ranks_per_node} ranks per node", cost_model.predict(
            "hierarchical_all_reduce", n, p, params, ranks_per_node=ranks_per_node)))
    with mpl.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
        styles = ("-", "--", "-.", (0, (3, 1, 1, 1, 1, 1)))
        for (name, t), style, colour in zip(curves, styles, ("#0072B2", "#D55E00", "#009E73", "#CC79A7"),
                                            strict=False):
            ax.loglog(n, t, ls=style, color=colour, lw=2, label=name)
        ax.loglog(n, cost_model.all_reduce_lower_bound(n, p, params), color="black", lw=1, ls=":",
                  label="lower bound (no algorithm reaches it everywhere)")
        ax.xaxis.set_major_formatter(mpl.ticker.FuncFormatter(_si_bytes))
        ax.set_xlabel("message size n (bytes, the whole vector being reduced)")
        ax.set_ylabel("predicted time per all-reduce (s)")
        ax.grid(True, which="major", color="0.9")
        ax.legend(frameon=False)
        gamma = "" if params.gamma == 0 else f", 1/γ = {params.reduce_GBps:g} GB/s"
        ax.set_title(f"{note}p = {p}, α = {params.alpha * 1e6:g} µs, 1/β = {params.bandwidth_GBps:g} GB/s"
                     f"{gamma}", loc="left")
    return _done(fig)
