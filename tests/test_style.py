"""The house style: the ground floor's figure style (`styled` draws inside the course's rcParams and detaches
the figure), files a reader can hold in mind (no module in src/distlab over `MAX_LINES` lines), and the
flat-tensor collectives called only through `distlab.dist_compat`."""

from __future__ import annotations

import ast
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from distlab import style

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "distlab"


def test_styled_draws_inside_the_course_rcparams_and_detaches_the_figure() -> None:
    seen = {}

    @style.styled
    def draw(title: str) -> Figure:
        """A figure with a title."""
        seen["font.size"] = mpl.rcParams["font.size"]
        fig, ax = plt.subplots()
        ax.set_title(title)
        return fig

    before = mpl.rcParams["font.size"]
    fig = draw("x")
    assert seen["font.size"] == style.RC["font.size"]
    assert mpl.rcParams["font.size"] == before  # nothing outside the figure changed
    assert fig.number not in plt.get_fignums()  # detached from pyplot: a notebook shows it once
    assert fig.axes[0].get_title() == "x" and draw.__doc__ == "A figure with a title."


# ---------------------------------------------------------------------------------- the house rules

MAX_LINES = 330  # CONTRIBUTING's "files under about 300 lines", with a margin before the test fails
FLAT_COLLECTIVES = {"reduce_scatter_single", "all_gather_single", "reduce_scatter_tensor",
                    "all_gather_into_tensor"}


def _modules() -> list[Path]:
    paths = sorted(PACKAGE.rglob("*.py"))
    assert paths, f"no modules found under {PACKAGE}"
    return paths


def test_no_module_is_longer_than_a_reader_can_hold_in_mind() -> None:
    long = {p.relative_to(ROOT).as_posix(): n for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, "\n".join(
        f"{path} has {n} lines (at most {MAX_LINES}): split it where its ideas part (the phases of an "
        "algorithm, its data types, its checks, its command line) into files of one idea each, or into a "
        "sub-package, and re-export the public names from the old module so that its imports keep working "
        "(CONTRIBUTING, Rules for code)" for path, n in sorted(long.items()))


def _torch_distributed_names(tree: ast.Module) -> set[str]:
    """The names a module binds to torch.distributed (`import torch.distributed as dist`, ...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            names |= {a.asname or a.name for a in node.names if a.name == "distributed"}
    return names


def _flat_collective_uses(path: Path) -> list[str]:
    """Where `path` reaches one of the flat-tensor collectives through torch.distributed itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = _torch_distributed_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FLAT_COLLECTIVES:
            base = ast.unparse(node.value)
            if base in aliases or base == "torch.distributed":
                found.append(f"line {node.lineno}: {base}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            found += [f"line {node.lineno}: from torch.distributed import {a.name}"
                      for a in node.names if a.name in FLAT_COLLECTIVES]
    return found


def test_the_flat_collectives_come_from_dist_compat() -> None:
    uses = {p.relative_to(ROOT).as_posix(): u for p in _modules()
            if p.name != "dist_compat.py" and (u := _flat_collective_uses(p))}
    assert not uses, "\n".join(
        f"{path}: {', '.join(u)}: call distlab.dist_compat.reduce_scatter_single / all_gather_single "
        "instead (torch 2.13's names, with the older names as the fallback on a GPU node's older torch)"
        for path, u in sorted(uses.items()))


def test_the_flat_collective_check_sees_a_direct_call(tmp_path: Path) -> None:
    f = tmp_path / "chapter.py"
    f.write_text("import torch.distributed as d\nfrom torch.distributed import all_gather_into_tensor\n"
                 "d.reduce_scatter_tensor(out, x)\nhint = 'use dist.all_gather_single'\n")
    assert _flat_collective_uses(f) == ["line 2: from torch.distributed import all_gather_into_tensor",
                                        "line 3: d.reduce_scatter_tensor"]
