"""Chapter 8's entry point: measure this machine's data paths beside the catalog's figures.

    python -m distlab.hardware                                   # print the table
    python -m distlab.hardware --out assets/hardware/MACHINE.json  # also keep it, with the hardware named

The measurements are `distlab.hardware.bench`'s; this file only reads the options, prints, and writes the
JSON (the results, the hardware they came from, and the command that made them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from distlab.cli_types import add_world_size, positive_int, size
from distlab.hardware import bench

PROG = "python -m distlab.hardware"


def parser() -> argparse.ArgumentParser:
    """The command line's options, each with its default in the help."""
    p = argparse.ArgumentParser(prog=PROG, description=(bench.__doc__ or "").split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help="also write the results and the hardware as JSON to this file")
    p.add_argument("--bytes", type=positive_int, default=256 << 20, help="bytes per copy")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed repeats per path (the median is kept)")
    add_world_size(p, 2, "ranks for the collective's bus bandwidth (GPUs under NCCL, else CPU processes)")
    p.add_argument("--size", type=size, default="64M", help="the collective's largest message, e.g. 4M")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure, print the table, and write JSON to --out if given; returns the JSON data."""
    p = parser()
    args = p.parse_args(argv)
    if args.world_size < 2:
        p.error(f"--world-size {args.world_size}: a collective needs at least 2 ranks")
    if args.world_size > 64 or (args.world_size > (os.cpu_count() or 1) * 8):
        p.error(f"--world-size {args.world_size} is more ranks than this machine can start; use at most "
                f"{min(64, (os.cpu_count() or 1) * 8)}")
    results = bench.run_all(args.bytes, args.repeats, args.world_size, str(args.size))
    print(bench.format_results(results))
    words = list(argv) if argv is not None else sys.argv[1:]
    data = {"command": " ".join([PROG, *words]), "hardware": bench.hardware_info(),
            "results": [asdict(r) | {"percent_of_spec": r.percent_of_spec} for r in results]}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {args.out}")
    return data


if __name__ == "__main__":
    main()
