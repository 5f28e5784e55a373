"""Write the chapter tables of README.md and CONTRIBUTING.md from `distlab.chapters` (the one table).

    python tools/chapter_tables.py           # rewrite the tables in place
    python tools/chapter_tables.py --check   # exit 1, naming the file, if a table is out of date

`tests/test_chapters.py` runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distlab import chapters

ROOT = Path(__file__).resolve().parents[1]


def stale(root: Path = ROOT, write: bool = False) -> list[str]:
    """The files whose generated tables differ from `distlab.chapters`; rewritten when `write`."""
    out = []
    for name in sorted({f for f, _, _ in chapters.GENERATED}):
        path = root / name
        old = path.read_text()
        new = old
        for file, table, render in chapters.GENERATED:
            if file == name:
                new = chapters.rewrite(new, table, render())
        if new != old:
            out.append(name)
            if write:
                path.write_text(new)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/chapter_tables.py", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="only report tables that are out of date")
    args = p.parse_args(argv)
    files = stale(write=not args.check)
    for name in files:
        print(f"{name}: chapter tables {'out of date' if args.check else 'rewritten'} "
              "(source: src/distlab/chapters.py)")
    return 1 if files and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
