"""Pictures of chapter 1's collectives, computed from the definitions and schedules they illustrate.

Nothing here is drawn by hand. `apply_semantics` applies each collective's definition (MPI Forum 2021,
"MPI: A Message-Passing Interface Standard 4.0", ch. 6) to symbolic buffers, and the "after" half of each
semantics picture is its output. The ring pictures replay `ring_all_reduce_schedule`, the schedule that
`ring_all_reduce` runs (Patarasuk & Yuan 2009), on symbolic data, so a wrong schedule draws a wrong picture.
Tree and recursive-doubling steps follow Thakur, Rabenseifner & Gropp 2005, sec. 4.

A cell is a sum of symbolic terms, kept as a sorted tuple: ("A0", "B0") is rank 0's chunk 0 plus rank 1's
chunk 0 (rank r is the letter chr(65 + r)); None is a slot whose content is not defined.

Every function returns a matplotlib Figure and leaves global state alone: rcParams change only inside
`mpl.rc_context`, and each figure is closed in pyplot before it is returned (a notebook shows it once,
`fig.savefig` still works). Colours: the Okabe & Ito (2008) palette, safe for colour-blind readers.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from distlab.collectives.algorithms import ring_all_reduce_schedule

COLLECTIVES = ("broadcast", "scatter", "gather", "reduce", "all_reduce", "all_gather", "reduce_scatter",
               "all_to_all")
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999")
Cell = tuple[str, ...] | None
_RC = {"font.size": 8.5, "axes.titlesize": 9, "axes.labelsize": 8.5, "legend.fontsize": 8,
       "font.family": "DejaVu Sans", "savefig.dpi": 150}
_SUB = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
_DOING = {"broadcast": "the root's buffer is copied to every rank",
          "scatter": "the root's chunk i goes to rank i",
          "gather": "rank i's buffer goes to slot i on the root",
          "reduce": "the element-wise sum of all buffers lands on the root",
          "all_reduce": "every rank gets the element-wise sum of all buffers",
          "all_gather": "every rank gets every rank's buffer, in rank order",
          "reduce_scatter": "rank i gets the sum of everyone's chunk i",
          "all_to_all": "rank i's chunk j goes to slot i on rank j"}


def letter(rank: int) -> str:
    """The symbol of rank `rank`'s data: A, B, C, ..."""
    return chr(ord("A") + rank)


# --------------------------------------------------------------------------------------------------
# Symbolic semantics and traces (pure Python, no drawing)
# --------------------------------------------------------------------------------------------------

def _as_cell(c: str | Sequence[str] | None) -> Cell:
    return None if c is None else (c,) if isinstance(c, str) else tuple(sorted(c))


def _sum(cells: Sequence[Cell]) -> Cell:
    return None if any(c is None for c in cells) else tuple(sorted(t for c in cells for t in c))


def _split(buf: list[Cell], p: int, collective: str) -> list[list[Cell]]:
    if len(buf) % p:
        raise ValueError(f"{collective} splits a buffer of {len(buf)} cells into {p} equal chunks; "
                         f"give it a multiple of {p} cells")
    k = len(buf) // p
    return [buf[i * k:(i + 1) * k] for i in range(p)]


def apply_semantics(collective: str, buffers: Sequence[Sequence[str | Sequence[str] | None]],
                    root: int = 0) -> list[list[Cell]]:
    """Each rank's output buffer after `collective`, given each rank's input buffer (a list of cells).

    A cell is a term like "A0", a sequence of terms (a sum), or None. Ranks that receive nothing
    (all but the root in gather and reduce) get []. Sums are sorted tuples, so they compare exactly.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"collective={collective!r} is not known; choose one of {', '.join(COLLECTIVES)}")
    p = len(buffers)
    if p == 0:
        raise ValueError("buffers=[] holds no rank; pass one buffer (a list of cells) per rank")
    if not 0 <= root < p:
        raise ValueError(f"root={root} is not one of the {p} ranks; choose a root in 0..{p - 1}")
    bufs = [[_as_cell(c) for c in b] for b in buffers]
    if collective == "broadcast":
        return [list(bufs[root]) for _ in range(p)]
    if collective == "scatter":
        return _split(bufs[root], p, collective)
    if collective in ("gather", "all_gather"):
        joined = [c for b in bufs for c in b]
        return [list(joined) if collective == "all_gather" or r == root else [] for r in range(p)]
    if collective == "all_to_all":
        parts = [_split(b, p, collective) for b in bufs]
        return [[c for j in range(p) for c in parts[j][i]] for i in range(p)]
    if len({len(b) for b in bufs}) != 1:
        raise ValueError(f"{collective} adds buffers element by element, so they must be of equal length; "
                         f"got lengths {[len(b) for b in bufs]}")
    total = [_sum(cells) for cells in zip(*bufs)]
    if collective == "reduce":
        return [list(total) if r == root else [] for r in range(p)]
    if collective == "all_reduce":
        return [list(total) for _ in range(p)]
    return _split(total, p, collective)  # reduce_scatter


def example_buffers(collective: str, p: int = 4, root: int = 0) -> list[list[Cell]]:
    """The input buffers the semantics figure starts from: rank r's chunk j is the term letter(r) + str(j)."""
    _check_p(p, "p", 1)
    if collective in ("broadcast", "scatter"):
        data = [(letter(root),)] if collective == "broadcast" else [(f"{letter(root)}{j}",) for j in range(p)]
        return [list(data) if r == root else [None] for r in range(p)]
    if collective in ("gather", "all_gather"):
        return [[(letter(r),)] for r in range(p)]
    if collective not in COLLECTIVES:
        apply_semantics(collective, [[None]])  # raises the ValueError that names the choices
    return [[(f"{letter(r)}{j}",) for j in range(p)] for r in range(p)]


def _check_p(p: int, name: str, low: int, high: int = 8) -> int:
    if isinstance(p, bool) or not isinstance(p, int) or not low <= p <= high:
        raise ValueError(f"{name}={p!r} must be an integer from {low} to {high} (the figures use one colour "
                         f"per rank), e.g. {name}=4")
    return p


def ring_all_reduce_trace(p: int) -> tuple[list, list[list[list[Cell]]]]:
    """Replay `ring_all_reduce_schedule(p)` on symbolic data: (schedule, states).

    states[k] is every rank's p chunks before step k (states[-1]: after the last step); rank r starts
    with letter(r) in every chunk. Reduce-scatter steps add the received chunk, all-gather steps copy it.
    Raises ValueError if a rank expects a chunk that its peer does not send it.
    """
    schedule = ring_all_reduce_schedule(_check_p(p, "p", 1))
    states = [[[(letter(r),) for _ in range(p)] for r in range(p)]]
    for k, step in enumerate(schedule):
        before, after = states[-1], [list(row) for row in states[-1]]
        for r, s in enumerate(step):
            peer = step[s.recv_from]
            if peer.send_to != r or peer.send_chunk != s.recv_chunk:
                raise ValueError(f"schedule step {k}: rank {r} expects chunk {s.recv_chunk} from rank "
                                 f"{s.recv_from}, which sends chunk {peer.send_chunk} to rank {peer.send_to}")
            incoming = before[s.recv_from][s.recv_chunk]
            old = before[r][s.recv_chunk]
            after[r][s.recv_chunk] = _sum([old, incoming]) if "reduce" in str(s.phase) else incoming
        states.append(after)
    return schedule, states
