"""No function of the package is over cyclomatic complexity 12, as radon counts it (issue 36).

ruff's C901 (McCabe, `max-complexity = 12` in pyproject.toml) holds the same bound while a file is being
written; radon counts a little more (each `and`/`or` in a condition is a branch, a class is scored from its
methods), and radon's number is the one a reviewer runs (`radon cc -s -n C src/distlab`), so the suite
holds it too.
"""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

SRC = Path(__file__).resolve().parents[1] / "src" / "distlab"
LIMIT = 12


def _blocks(path: Path) -> list[tuple[int, str, int]]:
    """(line, name, complexity) of every function, method, closure and class of one file, in line order."""
    found = set()
    for block in cc_visit(path.read_text()):
        owner = getattr(block, "classname", None)
        found.add((block.lineno, f"{owner}.{block.name}" if owner else block.name, block.complexity))
        for closure in getattr(block, "closures", ()):
            found.add((closure.lineno, f"{block.name}.{closure.name}", closure.complexity))
    return sorted(found)


def test_no_function_is_over_complexity_12() -> None:
    over = [f"{path.relative_to(SRC.parent)}:{line} {name} ({score})"
            for path in sorted(SRC.rglob("*.py")) for line, name, score in _blocks(path) if score > LIMIT]
    assert not over, (f"{len(over)} functions over complexity {LIMIT} (radon): split each into named steps, "
                      "one idea per function:\n" + "\n".join(over))


def test_the_count_is_radons() -> None:
    """Five ifs, one of them with an `and`, score 1 + 5 + 1 = 7: the limit is not vacuous."""
    source = ("def f(a, b):\n" + "".join(f"    if a == {i}:\n        return {i}\n" for i in range(4))
              + "    if a and b:\n        return 9\n    return 0\n")
    assert [(b.name, b.complexity) for b in cc_visit(source)] == [("f", 7)]
