"""A static guard for the labs' rank functions (issue 34, item 4): on a GPU node with a GPU per rank a lab's
`launch.run(fn, p)` runs fn under NCCL, and a tensor that fn makes without `device=` is on the CPU, which
NCCL refuses. This reads every lab's code cells, finds the functions handed to `launch.run` (or `run`),
and lists each tensor constructor inside them that names no device and is not moved with `.to(...)` /
`.cuda()` right away.

KNOWN lists the labs that still have such calls (none now: labs 00, 06 and 10 were the last); the test
fails on any other lab, and on a known lab whose list grows, so the set only shrinks. It also lists a
device mesh built on the literal "cpu" inside a rank function that may run under NCCL (one whose launches
do not all name backend="gloo"): lab 10 had two.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

LABS = Path(__file__).resolve().parents[1] / "labs"
FACTORIES = {"zeros", "ones", "empty", "full", "randn", "rand", "randint", "arange", "tensor", "linspace",
             "eye", "randperm"}
MOVES = {"to", "cuda"}
# lab -> the rank functions with calls still to fix (a device= or a .to(launch.device()) each)
KNOWN: dict[str, set[str]] = {}


def _code(lab: Path) -> str:
    cells = json.loads(lab.read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
               for c in cells if c["cell_type"] == "code"]
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for src in sources for line in src.splitlines())


def _launched(tree: ast.AST) -> set[str]:
    """Names of the functions handed to launch.run(...) or run(...) as their first argument."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name):
            called = ast.unparse(node.func)
            if called in ("launch.run", "run"):
                names.add(node.args[0].id)
    return names


def _moved(fn: ast.AST) -> set[int]:
    """ids of the constructor calls whose result goes straight into a .to(...) or .cuda() chain."""
    moved = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MOVES:
            inner = node.func.value
            while isinstance(inner, (ast.Call, ast.Attribute)):
                moved.add(id(inner))
                inner = inner.func if isinstance(inner, ast.Call) else inner.value
    return moved


def deviceless(source: str) -> dict[str, list[str]]:
    """For each launched function of `source`: its tensor constructors without a device, as source text."""
    tree = ast.parse(source)
    found: dict[str, list[str]] = {}
    launched = _launched(tree)
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and fn.name in launched):
            continue
        moved = _moved(fn)
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and ast.unparse(node.func.value) == "torch" and node.func.attr in FACTORIES
                    and not any(k.arg == "device" for k in node.keywords) and id(node) not in moved):
                found.setdefault(fn.name, []).append(ast.unparse(node))
    return found


def test_every_labs_rank_functions_name_their_device():
    new = {}
    for lab in sorted(LABS.glob("[0-9][0-9]_*.ipynb")):
        found = deviceless(_code(lab))
        extra = set(found) - KNOWN.get(lab.stem, set())
        if extra:
            new[lab.stem] = {name: found[name] for name in sorted(extra)}
    assert not new, "\n".join(
        f"{lab}: {name} makes {', '.join(calls)} without a device: pass device=launch.device() (or move it "
        "with .to(launch.device())), so that it runs under NCCL on a GPU node" for lab, fns in new.items()
        for name, calls in fns.items())


def test_the_known_labs_still_have_what_is_listed():
    """When a known lab is fixed, its entry goes: the list says exactly what is left."""
    for lab, names in KNOWN.items():
        assert set(deviceless(_code(LABS / f"{lab}.ipynb"))) == names, lab


def test_the_guard_sees_a_constructor_without_a_device():
    source = ("def rank_fn():\n    a = torch.zeros(3)\n    b = torch.ones(2, device=launch.device())\n"
              "    c = torch.randint(5, (4,)).double().to(dev)\n    return a, b, c\n\n"
              "def not_launched():\n    return torch.zeros(1)\n\nlaunch.run(rank_fn, 2)\n")
    assert deviceless(source) == {"rank_fn": ["torch.zeros(3)"]}



def _gloo_only(tree: ast.AST) -> set[str]:
    """Names of the functions every launch of which names backend="gloo" (they never run under NCCL)."""
    launches: dict[str, list[bool]] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name)
                and ast.unparse(node.func) in ("launch.run", "run")):
            gloo = any(k.arg == "backend" and isinstance(k.value, ast.Constant) and k.value.value == "gloo"
                       for k in node.keywords)
            launches.setdefault(node.args[0].id, []).append(gloo)
    return {name for name, gloo in launches.items() if all(gloo)}


def cpu_meshes(source: str) -> dict[str, list[str]]:
    """For each launched function of `source` that may run under NCCL: its device meshes built on the
    literal "cpu" (a mesh must be on the ranks' device type, `launch.device().type`, or come from
    `distlab.mesh.grid`)."""
    tree = ast.parse(source)
    found: dict[str, list[str]] = {}
    launched = _launched(tree) - _gloo_only(tree)
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and fn.name in launched):
            continue
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("init_device_mesh")
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "cpu"):
                found.setdefault(fn.name, []).append(ast.unparse(node))
    return found


def test_no_labs_rank_function_builds_a_cpu_mesh_where_it_may_run_on_nccl():
    found = {lab.stem: cpu_meshes(_code(lab)) for lab in sorted(LABS.glob("[0-9][0-9]_*.ipynb"))}
    assert not {lab: fns for lab, fns in found.items() if fns}, found


def test_the_guard_sees_a_cpu_mesh_unless_the_launch_is_gloo():
    source = ("def anywhere():\n    m = init_device_mesh('cpu', (2,))\n"
              "    ok = init_device_mesh(launch.device().type, (2,))\n\n"
              "def on_gloo():\n    m = init_device_mesh('cpu', (2,))\n\n"
              "launch.run(anywhere, 2)\nlaunch.run(on_gloo, 2, backend='gloo')\n")
    assert cpu_meshes(source) == {"anywhere": ["init_device_mesh('cpu', (2,))"]}

def _sizes(tree: ast.AST) -> set[int]:
    """The world sizes a lab launches with: the literal (or constant-named) second argument of each
    launch.run(...) / run(...), or its world_size=; a size computed at run time counts as 1 to 8."""
    looped = {t.id for n in ast.walk(tree) if isinstance(n, (ast.For, ast.comprehension))
              for t in ast.walk(n.target) if isinstance(t, ast.Name)}
    constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, int)
                 for t in n.targets if isinstance(t, ast.Name) and t.id not in looped}
    sizes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("launch.run", "run") and node.args:
            arg = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "world_size"), None)
            value = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", None))
            sizes |= {value} if isinstance(value, int) else set(range(1, 9))
    return sizes


@pytest.mark.parametrize("lab", sorted(p.stem for p in LABS.glob("[0-9][0-9]_*.ipynb")))
@pytest.mark.parametrize("gpus", (1, 2, 4, 8))
def test_each_labs_launches_on_a_node_with_gpus(lab, gpus, monkeypatch):
    """On a node with `gpus` GPUs, each of the lab's launches gets NCCL exactly when there is a GPU per
    rank; then its rank functions must name their device (the static guard above), known labs aside."""
    import torch
    import torch.distributed as dist

    from distlab import launch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    tree = ast.parse(_code(LABS / f"{lab}.ipynb"))
    chosen = {p: launch.resolve_backend("auto", p) for p in _sizes(tree)}
    assert all(b == ("nccl" if p <= gpus else "gloo") for p, b in chosen.items()), chosen
    if "nccl" in chosen.values():
        assert set(deviceless(ast.unparse(tree))) <= KNOWN.get(lab, set())
