"""What runs of a notebook when it is graded: read with `ast`, never executed here.

From the course's own lab (trusted, `labs/NN_topic.ipynb`) the grader takes an exercise's *context*: every
top-level import of the lab's code cells up to the exercise, and the top-level assignments of earlier cells
and of the exercise cell whose names the exercise cell reads (`server = catalog.lookup(...)`, `RANK = 5`).
From the student's notebook (untrusted) it takes only the exercise cell's top-level imports, functions and
classes (the cell that defines the functions the check is called with); the student's other cells, the
check call they typed and any other statement never run. Magics (`%matplotlib`) and shell lines (`!pip`)
are dropped before parsing.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)


def code_cells(notebook: Path) -> list[str]:
    """The source of each code cell of `notebook`, IPython's magics and shell lines blanked."""
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    out = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        out.append("\n".join("" if line.lstrip().startswith(("%", "!")) else line
                             for line in text.split("\n")))
    return out


def parse(source: str) -> ast.Module | None:
    """`source` parsed, or None when it is not valid Python."""
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _targets(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def read_names(tree: ast.AST) -> set[str]:
    """Every name `tree` reads."""
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def is_check_call(node: ast.AST) -> bool:
    """True for a call of an exercise check, `check_...(...)` or `module.check_...(...)`."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")).startswith("check_")


def _local_names(tree: ast.AST) -> set[str]:
    """The names bound inside the functions and lambdas of `tree` (their arguments and assignments)."""
    names: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            names |= {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
            names |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names


def context(cells: list[str], index: int) -> str:
    """The trusted setup of the exercise in code cell `index` of the course's lab `cells` (see above):
    the imports, and the assignments that define what the cell reads (and what those read), in order."""
    exercise = parse(cells[index]) or ast.Module(body=[], type_ignores=[])
    roots = [n for n in ast.walk(exercise) if isinstance(n, DEFINITIONS[:3]) or is_check_call(n)]
    needed = set().union(*(read_names(n) for n in roots)) - _local_names(exercise)
    nodes = _setup_statements(cells[:index + 1])
    needed = _grow(nodes, needed)
    return "\n".join(ast.unparse(n) for n in nodes if isinstance(n, ast.Import | ast.ImportFrom)
                     or _defines(n, needed))


def _setup_statements(cells: list[str]) -> list[ast.stmt]:
    """The top-level imports and assignments of `cells` (cells that do not parse give none), in order."""
    return [n for tree in (parse(c) for c in cells) for n in (tree.body if tree else [])
            if isinstance(n, ast.Import | ast.ImportFrom | ast.Assign | ast.AnnAssign)]


def _defines(node: ast.AST, needed: set[str]) -> bool:
    """True for an assignment of a `needed` name that calls no check."""
    return bool(_targets(node) & needed) and not any(is_check_call(n) for n in ast.walk(node))


def _grow(nodes: list[ast.stmt], needed: set[str]) -> set[str]:
    """`needed` and, until nothing is added, every name a needed assignment of `nodes` reads."""
    grown = True
    while grown:  # what a needed assignment reads is needed too
        grown = False
        for node in nodes:
            if _defines(node, needed) and not read_names(node) <= needed:
                needed |= read_names(node)
                grown = True
    return needed


@dataclass
class Submitted:
    """The student's code for one exercise: `source` (their imports, functions, classes), or `problem`
    and the verdict it earns, `kind` ("not written" or "crashed")."""

    source: str = ""
    problem: str = ""
    kind: str = ""


def student_code(notebook: Path, functions: tuple[str, ...]) -> Submitted:
    """The definitions of the exercise cell of `notebook` that defines every name in `functions` (the
    last such cell, as a notebook run in order would leave them); or the problem that prevents it."""
    try:
        cells = code_cells(notebook)
    except (OSError, ValueError, AttributeError) as err:
        return Submitted(problem=f"{notebook.name} cannot be read as a notebook ({type(err).__name__})",
                         kind="crashed")
    found, broken = _exercise_cell(cells, functions)
    if found is not None:
        return Submitted(source="\n\n".join(ast.unparse(n) for n in found.body if isinstance(n, DEFINITIONS)))
    if broken is not None:
        return Submitted(problem=f"the cell that defines {', '.join(functions)} is not valid Python "
                                 f"(code cell {broken + 1}); it was not run", kind="crashed")
    return Submitted(problem=f"no cell defines {', '.join(functions)}", kind="not written")


def _exercise_cell(cells: list[str], functions: tuple[str, ...]) -> tuple[ast.Module | None, int | None]:
    """The last cell of `cells` that defines every name in `functions` (parsed), and the index of the
    last cell that seems to define one of them but is not valid Python (None for either when none)."""
    found, broken = None, None
    for k, source in enumerate(cells):
        tree = parse(source)
        if tree is None:
            if any(f"def {f}(" in source or f"class {f}" in source for f in functions):
                broken = k
            continue
        defined = {n.name for n in tree.body if isinstance(n, DEFINITIONS[:3])}
        if set(functions) <= defined:
            found = tree
    return found, broken
