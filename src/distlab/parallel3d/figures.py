"""The chapter's pictures, drawn from the code they illustrate.

- `mesh_figure(dp, pp, tp)`: every rank of `distlab.mesh.grid(dp=, pp=, tp=)` as a box (global rank and
  (dp, pp, tp) coordinates), pipeline stages as columns and replicas as rows, with the groups of
  `distlab.mesh.layout` drawn as links: tp inside a box row, pp between stages, dp between replicas.
- `placement_figure(costs)`: the predicted communication time per step of each axis under each placement
  (`placement.compare_placements`), as stacked bars.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from distlab import style
from distlab.mesh import coordinates, layout
from distlab.parallel3d.cost_model import AXES
from distlab.parallel3d.placement import PlacementCost, compare_placements

AXIS_COLOURS = {"tp": style.VERMILION, "pp": style.BLUE, "dp": style.GREEN}


def _position(rank: int, dp: int, pp: int, tp: int) -> tuple[float, float]:
    c = coordinates(rank, pp=pp, dp=dp, tp=tp)
    return c["pp"] * (tp + 1.2) + c["tp"], -c["dp"] * 1.6


def mesh_figure(dp: int = 2, pp: int = 2, tp: int = 2) -> Figure:
    """Which rank talks to which over which axis, on a dp x pp x tp mesh."""
    groups = layout(dp=dp, pp=pp, tp=tp)
    with mpl.rc_context(dict(style.RC)):
        fig, ax = plt.subplots(figsize=(1.2 + 0.95 * pp * (tp + 1.2), 0.9 + 1.05 * dp))
        for axis in ("dp", "pp", "tp"):
            for g in groups[axis]:
                for a, b in zip(g, g[1:], strict=False):
                    (xa, ya), (xb, yb) = _position(a, dp, pp, tp), _position(b, dp, pp, tp)
                    bend = 0.25 if axis == "dp" else (0.3 if axis == "pp" else 0.0)
                    ax.annotate("", (xb, yb), (xa, ya), arrowprops={
                        "arrowstyle": "-|>" if axis == "pp" else "-", "color": AXIS_COLOURS[axis], "lw": 1.6,
                        "connectionstyle": f"arc3,rad={bend}", "shrinkA": 14, "shrinkB": 14})
        for rank in range(dp * pp * tp):
            x, y = _position(rank, dp, pp, tp)
            c = coordinates(rank, pp=pp, dp=dp, tp=tp)
            ax.add_patch(mpl.patches.FancyBboxPatch((x - 0.38, y - 0.32), 0.76, 0.64, fc="white",
                                                    boxstyle="round,pad=0.02", ec=style.COMPUTE, lw=1.2))
            ax.text(x, y + 0.08, f"{rank}", ha="center", va="center", fontsize=9, weight="bold")
            ax.text(x, y - 0.16, f"{c['dp']},{c['pp']},{c['tp']}", ha="center", va="center", fontsize=6.5)
        for s in range(pp):
            ax.text(s * (tp + 1.2) + (tp - 1) / 2, 0.75, f"stage {s}", ha="center", fontsize=8)
        handles = [mpl.lines.Line2D([], [], color=AXIS_COLOURS[d], lw=2, label=label) for d, label in
                   (("tp", "tp: all-reduce every layer"), ("pp", "pp: activations, gradients"),
                    ("dp", "dp: gradients once a step"))]
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3, frameon=False)
        ax.set_xlim(-0.8, pp * (tp + 1.2) - 0.6)
        ax.set_ylim(-1.6 * (dp - 1) - 0.7, 1.05)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(f"grid(dp={dp}, pp={pp}, tp={tp}): rank and (dp, pp, tp) coordinates")
        return style.done(fig)


def placement_figure(costs: list[PlacementCost] | None = None) -> Figure:
    """Predicted communication ms per step, per axis, for each placement (default: the book's example)."""
    title = "2 x DGX A100, (dp, pp, tp) = (2, 2, 4), a 1.3B GPT in bf16" if costs is None else ""
    costs = costs or compare_placements()
    with mpl.rc_context(dict(style.RC)):
        fig, ax = plt.subplots(figsize=(6.4, 2.4))
        left = [0.0] * len(costs)
        names = [c.name for c in costs]
        for axis in AXES:
            ms = [1e3 * c.axes[axis].seconds for c in costs]
            ax.barh(names, ms, left=left, color=AXIS_COLOURS[axis], label=axis)
            left = [a + b for a, b in zip(left, ms, strict=True)]
        ax.invert_yaxis()
        ax.set_xlabel("predicted communication per step (ms, no overlap)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        ax.set_title(title)
        return style.done(fig)
