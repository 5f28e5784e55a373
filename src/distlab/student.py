"""Make the student version of a lab: the worked solutions out, a stub and a clean slate in.

A lab's exercise cells carry the instructor's solution between two marker lines:

    def my_ring_all_reduce(tensor):
        # BEGIN SOLUTION
        ...the worked answer, which CI runs under nbval...
        # END SOLUTION

The student version keeps everything else and replaces each marked region with a stub that raises
`NotImplementedError`, at the same indentation, and clears what a run leaves behind, the way nbstripout
does: every output and execution count, the cells' execution metadata (timings, ``collapsed``,
``scrolled``) and the notebook's stored widget state, so that nothing gives the answer away and the
student starts from a clean notebook. Cell tags (``hide-input``, ``nbval-ignore-output``) stay. The
course's check functions say "not written yet" when they meet that stub.

    python -m distlab.student labs/01_collectives.ipynb --out _build/student

Links from a lab to the book (``../book/04-pipeline.md``) are rewritten for the folder the student version
goes to, so that they still open from ``_build/student``.

The student's own working copies (what ``make lab`` opens) are made the same way, once:

    python -m distlab.student labs/*.ipynb --out mylabs --keep       # writes only the labs not there yet
    python -m distlab.student labs/04_pipeline.ipynb --out mylabs --reset   # lab 04 fresh again

``--keep`` never touches a copy that exists, so the student's work survives every later ``make lab``;
``--reset`` first moves the student's copy aside to ``NN_topic.before-reset.ipynb`` and then writes a fresh
one (``make lab-reset LAB=04``). No backup is ever overwritten: a second reset keeps the copy as
``NN_topic.before-reset-2.ipynb``, a third as ``-3``, and so on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
STUB = 'raise NotImplementedError("Your turn: write this part (see the instructions above)")'
_MARKER = re.compile(r"^(?P<indent>[ \t]*)(?P<marker># (?:BEGIN|END) SOLUTION)[ \t]*$")
# What a run leaves in the metadata (nbstripout's defaults): per cell, and for the whole notebook.
RUN_CELL_METADATA = ("execution", "ExecuteTime", "collapsed", "scrolled")
RUN_NOTEBOOK_METADATA = ("widgets", "signature")


def strip_solutions(source: str, where: str = "cell") -> tuple[str, int]:
    """Replace each BEGIN/END SOLUTION region of `source` by a stub; return the text and the count."""
    out: list[str] = []
    inside, count, begin_line = False, 0, 0
    for i, line in enumerate(source.split("\n"), start=1):
        m = _MARKER.match(line)
        if m and m["marker"] == BEGIN:
            if inside:
                raise ValueError(f"{where}, line {i}: '{BEGIN}' inside another solution (opened on line "
                                 f"{begin_line}); close the first with '{END}'")
            inside, begin_line, count = True, i, count + 1
            out.append(f"{m['indent']}{STUB}")
        elif m:
            if not inside:
                raise ValueError(f"{where}, line {i}: '{END}' without a matching '{BEGIN}' above it")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}, line {begin_line}: '{BEGIN}' is never closed; add '{END}' after the "
                         "solution")
    return "\n".join(out), count


_BOOK_LINK = re.compile(r"\]\(\.\./book/")


def relink(source: str, book: str) -> str:
    """Point the Markdown links `](../book/...)` of a lab at `book`, the book's folder as seen from where
    the student version goes (unchanged when that is `../book`)."""
    return _BOOK_LINK.sub(f"]({book}/", source)


def student_notebook(nb: dict, name: str = "notebook", book: str = "../book") -> tuple[dict, int]:
    """Return a copy of notebook `nb` (nbformat 4 JSON) with solutions stubbed and what a run leaves
    behind removed (outputs, execution counts and metadata, widget state); and the number of stubs.
    `book`: the book's folder relative to where the copy goes, for the lab's links into the book."""
    nb = json.loads(json.dumps(nb))
    for key in RUN_NOTEBOOK_METADATA:
        nb.get("metadata", {}).pop(key, None)
    total = 0
    for index, cell in enumerate(nb["cells"]):
        for key in RUN_CELL_METADATA:
            cell.get("metadata", {}).pop(key, None)
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if relink(text, book) != text:  # otherwise the cell stays exactly as it was
                cell["source"] = relink(text, book)
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        source, count = strip_solutions(source, where=f"{name}, cell {index}")
        total += count
        cell["source"] = source
        cell["outputs"] = []
        cell["execution_count"] = None
    return nb, total


def backup_name(target: Path) -> Path:
    """The first free backup of the student's copy `target` (NN_topic.ipynb): NN_topic.before-reset.ipynb,
    then NN_topic.before-reset-2.ipynb, -3, ...; an existing backup is never reused."""
    aside, n = target.with_name(f"{target.stem}.before-reset.ipynb"), 1
    while aside.exists():
        n += 1
        aside = target.with_name(f"{target.stem}.before-reset-{n}.ipynb")
    return aside


def _earlier(aside: Path) -> str:
    """What a reset says about the backups an earlier reset left (kept, never overwritten)."""
    stem = aside.name.split(".before-reset")[0]
    earlier = sorted(p.name for p in aside.parent.glob(f"{stem}.before-reset*.ipynb") if p != aside)
    return f" (earlier backups kept: {', '.join(earlier)})" if earlier else ""


def write_student_labs(labs: list[Path], out: Path, keep: bool = False, reset: bool = False) -> list[str]:
    """Write the student version of each lab into `out`; return one line per lab saying what happened.

    `keep`: leave every copy that exists as it is (the student's work); `reset`: move an existing copy
    aside (to the first free `backup_name`) and write a fresh one."""
    if keep and reset:
        raise ValueError("keep=True and reset=True contradict each other: --keep protects the student's "
                         "copies, --reset replaces one; pass one of them")
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for lab in labs:
        target = out / lab.name
        if keep and target.exists():
            lines.append(f"{target}: kept (your copy; `make lab-reset LAB={lab.name[:2]}` starts it afresh)")
            continue
        if reset and target.exists():
            aside = backup_name(target)
            target.replace(aside)
            lines.append(f"{target}: your copy moved to {aside.name}" + _earlier(aside))
        book = Path(os.path.relpath(lab.resolve().parent.parent / "book", out.resolve())).as_posix()
        nb, count = student_notebook(json.loads(lab.read_text()), name=str(lab), book=book)
        target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        lines.append(f"{target}: {count} solution(s) replaced by stubs, outputs and run metadata cleared")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m distlab.student", description=__doc__.split("\n")[0])
    parser.add_argument("labs", nargs="+", type=Path, help="lab notebooks (.ipynb)")
    parser.add_argument("--out", type=Path, default=Path("_build/student"), help="output folder")
    parser.add_argument("--keep", action="store_true",
                        help="write only the labs that --out does not hold yet (the student's copies stay)")
    parser.add_argument("--reset", action="store_true",
                        help="replace the copy in --out by a fresh one (the old one is moved aside)")
    args = parser.parse_args(argv)
    missing = [str(lab) for lab in args.labs if not lab.is_file()]
    if missing:
        parser.error(f"no such lab: {', '.join(missing)} (give lab notebooks such as labs/04_pipeline.ipynb)")
    try:
        lines = write_student_labs(args.labs, args.out, keep=args.keep, reset=args.reset)
    except ValueError as err:
        parser.error(str(err))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
