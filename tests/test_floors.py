"""The floors of the house (CONTRIBUTING.md, "The house"): which part of `src/distlab` may import which.

- the ground floor imports no chapter and nothing on the roof;
- a chapter imports the ground floor, chapter 1's collectives and earlier chapters, never a later one;
- the roof (the tools that read every chapter) may import anything; nothing else imports it;
- no two files import each other, directly or round a longer loop.

Every import counts, at any depth: a function-level import is still a dependency, only a hidden one.
The modules are read with `ast`, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from distlab.chapters import CHAPTERS

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "distlab"

# The ground floor: the course-wide pieces every chapter uses (each a module or package of src/distlab).
GROUND = frozenset({
    "launch", "mesh", "layout", "model_shape", "comm_log", "comm_record", "dist_compat", "parity",
    "reference", "sharding", "timing", "checks", "style", "catalog", "catalog_rows", "device_names",
    "kernel_rates", "cli_types", "explorers", "topology", "ring_hops", "progress_record", "staged_p2p",
    "models", "moe_shape", "expert_fold",
})
# The roof: the tools that import the chapters (the command, the chapter table, the figure registry...).
ROOF = frozenset({
    "__init__", "__main__", "cli", "chapters", "figures", "student", "progress", "doctor", "doctor_network",
    "gpu_check", "grading",
})
# Imports that break a rule on purpose, each with its reason: (importer, imported) -> reason. Keep it tiny.
ALLOWED: dict[tuple[str, str], str] = {}
# Packages that import each other (no two files do), each with its reason. Keep it tiny.
ALLOWED_PACKAGE_CYCLES: dict[frozenset[str], str] = {}


def chapter_of() -> dict[str, int]:
    """Each chapter package's chapter number, from the one chapter table (`launch` is chapter 0's
    package, but it lives on the ground floor)."""
    return {p: c.number for c in CHAPTERS for p in c.packages if p not in GROUND}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package: its dotted name -> its file."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The absolute name of `from ... import` for a module called `name`."""
    if node.level == 0:
        return node.module or ""
    base = name.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The distlab modules `name` imports, each at its most specific: `from distlab.a import b` is
    `distlab.a.b` where that is a module, else `distlab.a`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, name, path.name == "__init__.py")
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def floor(module: str) -> str:
    """"ground", "roof" or "chapter N" for a dotted module name."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    if top in GROUND:
        return "ground"
    if top in ROOF:
        return "roof"
    chapters = chapter_of()
    if top in chapters:
        return f"chapter {chapters[top]}"
    raise AssertionError(f"{module} is on no floor: add {top!r} to GROUND or ROOF in tests/test_floors.py, "
                         "or its package to a chapter in src/distlab/chapters.py")


def may_import(importer: str, imported: str) -> bool:
    a, b = floor(importer), floor(imported)
    if a == "roof":
        return True
    if b == "roof":
        return False
    if a == "ground":
        return b == "ground"
    if b == "ground":
        return True
    return int(b.split()[1]) <= int(a.split()[1])


def violations() -> list[str]:
    """Every import that breaks a floor rule and is not in ALLOWED, as 'importer (floor) -> imported
    (floor)'."""
    bad = []
    for importer, targets in sorted(graph().items()):
        for imported in sorted(targets):
            if not may_import(importer, imported) and (importer, imported) not in ALLOWED:
                bad.append(f"{importer} ({floor(importer)}) -> {imported} ({floor(imported)})")
    return bad


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module: modules that reach each other (a few
    hundred modules, so reachability from each is quick enough)."""
    reach = {node: reachable(edges, node) for node in edges}
    found: list[list[str]] = []
    done: set[str] = set()
    for node in sorted(edges):
        if node in done or node not in reach[node]:
            continue
        component = sorted(m for m in reach[node] if node in reach.get(m, ()))
        done.update(component)
        found.append(component)
    return found


def test_every_module_is_on_a_floor():
    for name in modules():
        floor(name)  # raises, naming the module, if it is on none


def test_imports_go_down_the_floors():
    bad = violations()
    assert not bad, "imports against the floors (CONTRIBUTING.md, 'The house'):\n" + "\n".join(bad)


def test_no_file_imports_itself_round_a_loop():
    loops = cycles(graph())
    assert not loops, "import cycles between files:\n" + "\n".join(" <-> ".join(c) for c in loops)


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which chapter package (or subpackage) imports which: a module belongs to the package of its folder;
    the top-level package, ground floor and roof, is left out (the rules above place its files)."""
    files = modules()

    def package(m: str) -> str:
        return m if files[m].name == "__init__.py" else m.rsplit(".", 1)[0]

    out: dict[str, set[str]] = {}
    for importer, targets in edges.items():
        if package(importer) != "distlab":
            out.setdefault(package(importer), set()).update(
                package(t) for t in targets if package(t) not in ("distlab", package(importer)))
    return out


def test_no_two_packages_import_each_other():
    loops = [c for c in cycles(package_graph(graph())) if frozenset(c) not in ALLOWED_PACKAGE_CYCLES]
    assert not loops, "packages that import each other:\n" + "\n".join(" <-> ".join(c) for c in loops)


def test_the_allowed_exceptions_are_still_used():
    edges = graph()
    stale = [pair for pair in ALLOWED if pair[1] not in edges.get(pair[0], set())]
    assert not stale, f"ALLOWED lists imports that no longer exist, remove them: {stale}"
    loops = {frozenset(c) for c in cycles(package_graph(edges))}
    stale_loops = [sorted(c) for c in ALLOWED_PACKAGE_CYCLES if c not in loops]
    assert not stale_loops, f"ALLOWED_PACKAGE_CYCLES lists cycles that are gone, remove them: {stale_loops}"


def test_the_rules_catch_what_they_should():
    """The checker itself: a later chapter, the roof and a cycle are caught; the ground and chapter 1
    are allowed."""
    assert not may_import("distlab.moe.layer", "distlab.hardware.topology")
    assert not may_import("distlab.mesh", "distlab.collectives.ring")
    assert not may_import("distlab.memory.bench", "distlab.figures")
    assert may_import("distlab.moe.layer", "distlab.collectives.ring")
    assert may_import("distlab.moe.layer", "distlab.mesh")
    assert may_import("distlab.cli", "distlab.moe.layer")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}) == [["a", "b"], ["c", "d"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_function_level_imports_are_seen(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("import torch\n\n\ndef f():\n    from .ring import ring_all_reduce\n"
                      "    import distlab.mesh\n    from distlab import topology\n")
    known = {"distlab.collectives.ring", "distlab.mesh", "distlab.topology", "distlab.collectives.x"}
    got = imports_of("distlab.collectives.x", source, known)
    assert got == {"distlab.collectives.ring", "distlab.mesh", "distlab.topology"}


def test_contributing_lists_the_ground_floor_and_the_roof():
    """CONTRIBUTING.md's house section names every file of both lists (a new one is described there)."""
    text = (SRC.parent / "CONTRIBUTING.md").read_text()
    house = text[text.index("### The house"):text.index("<!-- chapters.py: packages")]
    missing = [name for name in sorted((GROUND | ROOF) - {"__init__"})
               if f"`{name}.py`" not in house and f"`{name}/`" not in house]
    assert not missing, f"CONTRIBUTING.md's house section does not describe {missing}"
