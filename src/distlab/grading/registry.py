"""The course's exercises, read from its labs: one `Exercise` per check call in a cell with a solution.

An exercise is a `check_...(...)` call in a code cell of `labs/NN_topic.ipynb` that holds a worked solution
(`# BEGIN SOLUTION`). Its *public* cases are that call, exactly as the lab makes it; its *hidden* cases are
`distlab.grading.hidden_cases.HIDDEN[check]`, which the student versions of the labs never contain. The
student's functions are the call's arguments that the cell defines (`my_ring_all_reduce`, or `MyF.apply`'s
`MyF`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from distlab.grading import extract

LABS = Path(__file__).resolve().parents[3] / "labs"  # the clone's labs (an editable install)


@dataclass(frozen=True)
class Exercise:
    """One exercise: its lab ("01_collectives"), its check, the student's functions it is called with,
    the lab's check call (the public cases) and the trusted setup that call needs."""

    lab: str
    check: str
    functions: tuple[str, ...]
    call: str
    context: str

    @property
    def key(self) -> str:
        return f"{self.lab}:{self.check}"


def _check_calls(tree: ast.Module) -> list[ast.Call]:
    """The `check_...(...)` calls of a cell, in order (bare, in `display(...)`, or assigned)."""
    calls = [node for node in ast.walk(tree) if extract.is_check_call(node)]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _call_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id


def lab_exercises(lab: Path) -> list[Exercise]:
    """The exercises of one course lab, in the lab's order."""
    cells = extract.code_cells(lab)
    out = []
    for index, source in enumerate(cells):
        tree = extract.parse(source)
        if tree is None or "# BEGIN SOLUTION" not in source:
            continue
        defined = {n.name for n in tree.body if isinstance(n, extract.DEFINITIONS[:3])}
        setup = extract.context(cells, index)
        for call in _check_calls(tree):
            used = extract.read_names(call)
            functions = tuple(n for n in dict.fromkeys(
                a.id for a in ast.walk(call) if isinstance(a, ast.Name)) if n in defined and n in used)
            out.append(Exercise(lab.stem, _call_name(call), functions, ast.unparse(call), setup))
    return out


def exercises(labs: Path = LABS) -> list[Exercise]:
    """Every exercise of the course, lab by lab."""
    return [e for lab in sorted(labs.glob("[0-9][0-9]_*.ipynb")) for e in lab_exercises(lab)]
