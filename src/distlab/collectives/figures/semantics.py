"""Pictures of what each collective means: every rank's buffer before and after, drawn as a grid.

The "after" half is `apply_semantics` (MPI Forum 2021, "MPI: A Message-Passing Interface Standard 4.0",
ch. 6) of the "before" half, so nothing is drawn by hand. The grid drawn here (rank r's buffer as row r,
chunk c as column c, a cell striped in the colours of the ranks whose data it sums) is also what the
schedule figures of `schedules.py` draw each step with, and the palette and rcParams here are shared
by the figures of later chapters. Colours: the Okabe & Ito (2008) palette, safe for colour-blind readers.
Each figure is closed in pyplot before it is returned, and rcParams change only inside `mpl.rc_context`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from distlab.collectives.traces import Cell, _check_p, apply_semantics, example_buffers
from distlab.style import OKABE_ITO, RC, done

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
    suffixes = {t[1:] for t in cell}
    if len(cell) <= 4 or len(set(cell)) < len(cell) or len(suffixes) > 1:
        return _written_out(cell)
    text = ",".join(f"{chr(r[0])}–{chr(r[-1])}" if len(r) > 2 else ",".join(map(chr, r))
                    for r in _runs(sorted(ord(t[0]) for t in cell)))
    suffix = suffixes.pop().translate(_SUB)
    return f"Σ({text}){suffix}" if suffix else f"Σ {text}"


def _written_out(cell: Sequence[str]) -> str:
    """Every term with its subscript, "A₀+B₀", on two lines past two terms."""
    terms = [t.translate(_SUB) for t in cell]
    half = 2 if len(terms) > 2 else len(terms)
    return "+".join(terms[:half]) + ("\n+" + "+".join(terms[half:]) if terms[half:] else "")


def _runs(codes: list[int]) -> list[list[int]]:
    """Sorted codes as runs of consecutive values: [65, 66, 67, 70] -> [[65, 66, 67], [70]]."""
    runs: list[list[int]] = []
    for c in codes:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs


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
    _grid_axes(ax, ys, ncols, right, headers,
               names if names is not None else [f"rank {r}" for r in range(len(rows))])
    ax.set_title(title, loc="left")
    return ys


def _grid_axes(ax: Axes, ys: list[float], ncols: int, right: float, headers: bool,
               names: Sequence[str]) -> None:
    """The grid's frame: limits around the cells, rank names on the left, chunk headers on top, no spines."""
    ax.set_xlim(-0.06, ncols + right)
    ax.set_ylim(min(ys) - 0.55, max(ys) + 0.55)
    ax.set_yticks(ys, names)
    ax.set_xticks([c + 0.46 for c in range(ncols)] if headers else [],
                  [f"c{c}" for c in range(ncols)] if headers else [])
    ax.xaxis.tick_top()
    ax.tick_params(length=0, pad=2)
    for spine in ax.spines.values():
        spine.set_visible(False)


def semantics_figure(collective: str, p: int = 4, root: int = 0) -> Figure:
    """Each rank's buffer before and after `collective`; the after is `apply_semantics` of the before."""
    before = example_buffers(collective, _check_p(p, "p", 1), root)
    after = apply_semantics(collective, before, root)
    rooted = collective in ("broadcast", "scatter", "gather", "reduce")
    names = [f"rank {r}" + (" (root)" if rooted and r == root else "") for r in range(p)]
    with mpl.rc_context(RC):
        fig, axes = plt.subplots(1, 2, figsize=(7.2, 0.5 * p + 1.0), gridspec_kw={"wspace": 0.18})
        for ax, rows, when in zip(axes, (before, after), ("before", "after"), strict=True):
            _grid(ax, rows, when, ncols=max([p] + [len(b) for b in before + after]), headers=False,
                  names=names if ax is axes[0] else [""] * p)
        left, right = axes[0].get_position().x1, axes[1].get_position().x0
        fig.add_artist(FancyArrowPatch((left + 0.01, 0.5), (right - 0.005, 0.5), transform=fig.transFigure,
                                       arrowstyle="-|>", mutation_scale=18, lw=1.5, color="0.2"))
        fig.suptitle(f"{collective}: {_DOING[collective]}", x=0.02, y=0.99, ha="left", va="bottom",
                     fontsize=9.5)
    return done(fig)
