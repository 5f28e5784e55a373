"""Command line: find planted hangs and a slowed rank on real ranks (chapter 13).

    python -m distlab.observe hang --world-size 4 --plantings 5 --seed 0
    python -m distlab.observe straggler --world-size 4 --slow-rank 2 --delay 0.05 --steps 6

`hang` runs the program of `plant` with randomly planted mistakes (which rank, which step, which
collective, which mistake, from `--seed`) and prints the diagnosis of each from the ranks' flight records,
and the hit rate; `straggler` slows one rank and prints what the outlier rule finds. Exit status 1 when a
diagnosis misses.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Sequence

from distlab import launch
from distlab.cli_types import add_json, add_seed, add_steps, add_world_size, positive_int
from distlab.observe.flight import BUFFER_VAR
from distlab.observe.hang import diagnose
from distlab.observe.plant import random_planting, run_planted
from distlab.observe.straggler import find_stragglers, timed_steps


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m distlab.observe", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    hang = sub.add_parser("hang", help="planted hangs, diagnosed from flight records",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_world_size(hang, 4, "ranks to start (at least 3, so that a majority names the culprit)")
    hang.add_argument("--plantings", type=positive_int, default=5, help="random plantings to run")
    add_steps(hang, 3, "steps of the planted program (3 collectives each)")
    add_seed(hang, "seed of the plantings")
    add_json(hang)
    slow = sub.add_parser("straggler", help="one slowed rank, found by the median + k x MAD rule",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_world_size(slow, 4, "ranks to start")
    slow.add_argument("--slow-rank", type=int, default=2, help="the rank that sleeps")
    slow.add_argument("--delay", type=float, default=0.05, help="seconds it sleeps per step")
    add_steps(slow, 6, "timed steps")
    add_json(slow)
    return p


def run_hangs(world_size: int, plantings: int, steps: int, seed: int) -> list[dict[str, object]]:
    """Each random planting and whether the diagnosis named its rank and sequence number."""
    os.environ.setdefault(BUFFER_VAR, "2000")
    rng = random.Random(seed)
    out = []
    for _ in range(plantings):
        planting = random_planting(rng, world_size, steps)
        records = launch.run(run_planted, world_size, steps, planting, 1.0, timeout=15)
        found = diagnose({r: rec for r, (_, rec) in enumerate(records)})
        hit = found is not None and (found.seq, found.ranks) == (planting.seq(), (planting.rank,))
        out.append({"planted": vars(planting), "seq": planting.seq(), "hit": hit,
                    "diagnosis": found.verdict() if found else "no divergence"})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.command == "hang":
        return _hang(p, args)
    return _straggler(p, args)


def _hang(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`hang`: run the plantings, print each diagnosis and the hit rate; 0 when every one is a hit."""
    if args.world_size < 3:
        p.error(f"--world-size {args.world_size}: use at least 3 ranks (with 2 there is no majority)")
    rows = run_hangs(args.world_size, args.plantings, args.steps, args.seed)
    hits = sum(bool(r["hit"]) for r in rows)
    if args.json:
        print(json.dumps({"plantings": rows, "hits": hits}, indent=2))
    else:
        for r in rows:
            print(f"{r['planted']} -> {r['diagnosis']} [{'hit' if r['hit'] else 'MISS'}]")
        print(f"named the planted rank and collective in {hits} of {len(rows)}")
    return 0 if hits == len(rows) else 1


def _straggler(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`straggler`: slow one rank, print what the outlier rule finds; 0 when it finds exactly that rank."""
    if not 0 <= args.slow_rank < args.world_size or args.delay < 0:
        p.error(f"--slow-rank {args.slow_rank} must be a rank below --world-size {args.world_size}, and "
                f"--delay {args.delay} >= 0")
    out = launch.run(timed_steps, args.world_size, args.steps, args.delay, args.slow_rank, timeout=60)
    report = find_stragglers([w for w, _ in out], [t for _, t in out])
    if args.json:
        print(json.dumps({"stragglers": report.stragglers, "work": report.work, "wait": report.wait,
                          "threshold": report.threshold}, indent=2))
    else:
        print(report.verdict())
    return 0 if report.stragglers == (args.slow_rank,) else 1


if __name__ == "__main__":
    raise SystemExit(main())
