"""The ``distlab`` command: ``distlab doctor [--json]`` and ``distlab figures OUTDIR``.

Also runnable as ``python -m distlab.cli``. Subcommands import their modules lazily, so ``distlab doctor``
does not pay for matplotlib and ``distlab figures`` does not probe the GPU.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence


def _doctor(args: argparse.Namespace) -> int:
    """Print the machine report (text, or JSON with ``--json``)."""
    from distlab import doctor

    result = doctor.report()
    print(result.to_json() if args.json else result)
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, one subparser per subcommand."""
    parser = argparse.ArgumentParser(prog="distlab", description="Tools for the distlab course.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    doctor = sub.add_parser("doctor", help="report the GPUs, NCCL, interconnect and what the labs will use")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(func=_doctor)
    figures = sub.add_parser("figures", help="write the book's static figures into OUTDIR")
    figures.add_argument("outdir", metavar="OUTDIR", help="folder for the PNG files (created if missing)")
    figures.set_defaults(func=_figures)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``distlab`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
