"""No lab calls torch.distributed's flat-tensor collectives by a name that only some torch versions have
(issue 34, cause 4): lab 1 called `dist.all_gather_single`, torch 2.13's name, which a GPU node's older
torch lacks. The package goes through `distlab.dist_compat`; so must the labs' code cells."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

from distlab import dist_compat

LABS = Path(__file__).resolve().parents[1] / "labs"
# torch 2.13's names, which dist_compat wraps, and the older names 2.13 deprecates in their favour
NEW_NAMES = {name for name, fn in inspect.getmembers(dist_compat, inspect.isfunction)
             if fn.__module__ == dist_compat.__name__}
OLD_NAMES = {"reduce_scatter_tensor", "all_gather_into_tensor"}


def direct_calls(source: str) -> list[str]:
    """Where `source` (a code cell, IPython magics dropped) reaches one of the names through
    torch.distributed itself (`dist.<name>`, `torch.distributed.<name>`, `from torch.distributed import`)."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    tree = ast.parse(code)
    aliases = {a.asname for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names if a.name == "torch.distributed" and a.asname} | {"dist"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in NEW_NAMES | OLD_NAMES:
            base = ast.unparse(node.value)
            if base in aliases or base == "torch.distributed":
                found.append(f"line {node.lineno}: {base}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            found += [f"line {node.lineno}: from torch.distributed import {a.name}"
                      for a in node.names if a.name in NEW_NAMES | OLD_NAMES]
    return found


def test_dist_compat_wraps_torch_2_13s_names():
    assert NEW_NAMES == {"reduce_scatter_single", "all_gather_single"}


def test_no_lab_calls_a_version_specific_collective_directly():
    uses = {}
    for lab in sorted(LABS.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(lab.read_text(encoding="utf-8"))["cells"]
        for k, cell in enumerate(cells):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "code" and (found := direct_calls(source)):
                uses[f"{lab.name}, cell {k}"] = found
    assert not uses, "\n".join(
        f"{where}: {', '.join(found)}: call distlab.dist_compat's reduce_scatter_single / all_gather_single "
        "instead (torch 2.13's names on any torch)" for where, found in uses.items())


def test_the_lab_check_sees_each_way_of_calling():
    cell = ("%matplotlib inline\nimport torch.distributed as d\nfrom torch.distributed import "
            "all_gather_into_tensor\nd.all_gather_single(y, x)\ndist.reduce_scatter_single(y, x)\n"
            "torch.distributed.reduce_scatter_tensor(y, x)\nall_gather_single(y, x)\n")
    assert direct_calls(cell) == ["line 3: from torch.distributed import all_gather_into_tensor",
                                  "line 4: d.all_gather_single", "line 5: dist.reduce_scatter_single",
                                  "line 6: torch.distributed.reduce_scatter_tensor"]
