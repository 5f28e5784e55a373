"""The role table of CONTRIBUTING ("The same role, the same file name") holds in every chapter package.

Read from CONTRIBUTING itself, so that the table and the tree cannot drift apart: every chapter package
has its `__init__.py` and names a file of a listed role by that role (no `simulation.py`, `explore.py` or
`experiments.py` beside the listed `simulate.py`, `figures.py` ...); no file is named after another
chapter (chapter 10 once had a `memory.py`); a `cost_model.py` or a `simulate.py` imports neither
torch.distributed nor the launcher (closed forms and simulations start no process); and every
`parity.py` speaks the ground floor's parity vocabulary, `distlab.parity`. Pure Python: no ranks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "distlab"
GROUND_FLOOR_PACKAGES = {"launch"}  # course-wide packages on the ground floor, not chapters
# Names a role's file must not take: the table's role under another name.
NOT_ROLE_NAMES = {"simulation", "simulator", "explore", "explorer", "experiments", "experiment", "costs",
                  "cost", "benchmark", "benchmarks", "plots", "plot", "viz", "check", "checks", "main", "cli"}


def role_table() -> dict[str, str]:
    """File name -> role, from the table after CONTRIBUTING's heading "The same role, the same file name"."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("### The same role, the same file name", 1)[1]
    table = section.split("Other files are named", 1)[0]
    rows = re.findall(r"^\| `([^`]+\.py)` \| (.+?) \|$", table, flags=re.M)
    return dict(rows)


def chapters() -> list[Path]:
    return sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()
                  and p.name not in GROUND_FLOOR_PACKAGES)


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_the_table_lists_the_roles() -> None:
    assert list(role_table()) == ["__init__.py", "cost_model.py", "simulate.py", "parity.py", "figures.py",
                                  "exercises.py", "bench.py", "__main__.py"]


@pytest.mark.parametrize("chapter", chapters(), ids=lambda p: p.name)
def test_files_take_the_role_names(chapter: Path) -> None:
    stems = {p.stem for p in chapter.glob("*.py")}
    assert not stems & NOT_ROLE_NAMES, f"{chapter.name}: {sorted(stems & NOT_ROLE_NAMES)}: use a role name"
    others = {p.name for p in chapters()} - {chapter.name}
    assert not stems & others, f"{chapter.name}: {sorted(stems & others)} is another chapter's name"


@pytest.mark.parametrize("path", [p for c in chapters() for name in ("cost_model.py", "simulate.py")
                                  for p in [c / name] if p.is_file()],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_closed_forms_and_simulations_start_no_process(path: Path) -> None:
    names = imported(path)
    for forbidden in ("torch.distributed", "distlab.launch", "multiprocessing", "subprocess"):
        assert not any(n == forbidden or n.startswith(forbidden + ".") for n in names), (path, forbidden)


@pytest.mark.parametrize("path", [c / "parity.py" for c in chapters() if (c / "parity.py").is_file()],
                         ids=lambda p: p.parent.name)
def test_parity_files_use_the_parity_vocabulary(path: Path) -> None:
    names = imported(path)
    assert any(n == "distlab.parity" or n.startswith("distlab.parity.") for n in names), path
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"^TOLERANCE\s*=", text, flags=re.M), f"{path}: use distlab.parity.TOLERANCE"
    assert not re.search(r"^def (max_difference|max_abs_diff|verdict)\(", text, flags=re.M), path
