"""The ``distlab`` command: the course's tools and every chapter's entry point under one name.

    distlab doctor [--json]        what this machine has and what the labs will use
    distlab progress [LAB]         which exercises pass, fail or are not written yet
    distlab check [mylabs/]        run the public cases of every lab in a folder, before handing in
    distlab grade SUBMISSIONS/     an instructor grades a class: public and hidden cases, a report
    distlab figures OUTDIR         draw the book's static figures
    distlab pipeline --schedule zbv ...   a chapter's command: the same as python -m distlab.pipeline ...
    distlab                        the commands, and every chapter (0 to 12) with its own

Also runnable as ``python -m distlab``. The chapters' commands come from `distlab.chapters`, the one
chapter table. Subcommands import their modules lazily, so ``distlab doctor``
does not pay for matplotlib and ``distlab figures`` does not probe the GPU. A chapter's command hands the
rest of the line to that chapter's ``__main__`` (``distlab pipeline --help`` shows its options). Output into
a closed pipe (``distlab doctor --json | head``) ends quietly, as other Unix tools do.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from distlab import chapters

# Each chapter's entry point as (command, chapter, what it does), from the one chapter table
# (`distlab.chapters`); the module is distlab.<command>. Chapter 0's command is `doctor`, handled below.
CHAPTERS = tuple((e.command, c.number, e.what) for c, e in chapters.entry_points() if e.module)


def epilog() -> str:
    """Every chapter, 0 to 12, with its commands: the last lines of `distlab --help`."""
    rows = [f"  {c.label}  {', '.join(e.command for e in c.entry_points):<28}{c.title.split(':')[0]}"
            for c in chapters.CHAPTERS]
    return "chapters and their commands:\n" + "\n".join(rows)


def _doctor(args: argparse.Namespace) -> int:
    """Print the machine report (text, or JSON with ``--json``)."""
    from distlab import doctor

    result = doctor.report()
    print(result.to_json() if args.json else result)
    return 0


def _progress(args: argparse.Namespace) -> int:
    """Print the student's progress, per lab."""
    from distlab import progress

    return progress.main([] if args.lab is None else [args.lab])


def _figures(args: argparse.Namespace) -> int:
    """Write every static figure of the book into ``args.outdir``."""
    try:
        figures = importlib.import_module("distlab.figures")
    except ModuleNotFoundError as exc:
        if exc.name != "distlab.figures":
            raise
        print("distlab figures: this checkout has no distlab.figures module yet", file=sys.stderr)
        return 1
    status = figures.main([args.outdir])
    return status if isinstance(status, int) else 0


# The grading tools parse their own options (distlab.grading.grade), as a chapter's command does.
TOOLS = {"grade": ("grade_main", "an instructor grades a class (one folder of notebooks per student): public "
                   "and hidden cases, a CSV/JSON/HTML report"),
         "check": ("check_main", "run the public cases of every lab in a folder of your notebooks, as the "
                   "grader will, before you hand in")}


def _tool(args: argparse.Namespace) -> int:
    """Hand the rest of the line to `distlab.grading.grade`'s command."""
    from distlab.grading import grade

    return getattr(grade, TOOLS[args.command][0])(args.rest)


def _chapter(args: argparse.Namespace) -> int:
    """Run ``python -m distlab.<command>`` with the rest of the command line."""
    module = importlib.import_module(f"distlab.{args.command}.__main__")
    status = module.main(args.rest)
    return status if isinstance(status, int) else 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, one subparser per subcommand."""
    parser = argparse.ArgumentParser(prog="distlab", description="Tools for the distlab course, and every "
                                     "chapter's command (`distlab COMMAND --help` for its options).",
                                     epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    doctor = sub.add_parser("doctor", help="chapter 0: report the GPUs, NCCL, interconnect and what the labs "
                            "will use")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(func=_doctor)
    progress = sub.add_parser("progress", help="which exercises pass, fail or are not written yet, per lab")
    progress.add_argument("lab", nargs="?", help="one lab's number, e.g. 04 (default: every lab)")
    progress.set_defaults(func=_progress)
    figures = sub.add_parser("figures", help="write the book's static figures into OUTDIR")
    figures.add_argument("outdir", metavar="OUTDIR", help="folder for the PNG files (created if missing)")
    figures.set_defaults(func=_figures)
    for command, (_, what) in TOOLS.items():
        sub.add_parser(command, help=what, add_help=False).set_defaults(func=_tool)
    for command, chapter, what in CHAPTERS:
        p = sub.add_parser(command, help=f"chapter {chapter}: {what}", add_help=False,
                           description=f"python -m distlab.{command}")
        p.set_defaults(func=_chapter)  # main() hands the rest of the line over before parsing
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``distlab`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:  # `distlab` alone: what it can do, not argparse's "required: COMMAND"
        parser.print_help()
        return 0
    if argv and argv[0] in {command for command, _, _ in CHAPTERS}:
        # A chapter's command: every later word is its own (argparse would take `--help` for distlab's).
        args = argparse.Namespace(command=argv[0], rest=argv[1:], func=_chapter)
    elif argv and argv[0] in TOOLS:
        args = argparse.Namespace(command=argv[0], rest=argv[1:], func=_tool)
    else:
        args = parser.parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (`head`) closed the pipe: stop quietly, and point stdout at /dev/null so that the
        # interpreter's own flush at exit does not raise again (Python's documented recipe, "signal").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status


if __name__ == "__main__":
    raise SystemExit(main())
