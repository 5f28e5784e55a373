"""Chapter 11's entry point: replicas that lose one of theirs and heal, and what that buys over checkpoints.

    python -m distlab.fault_tolerance heal --replicas 4 --kill 2:2 --join 3:4
    python -m distlab.fault_tolerance goodput --failures-per-day 20 --replicas 8

`heal` starts `--replicas` data-parallel replicas as ranks (`replicas.run_replicas`, gloo), SIGKILLs one at
the step `--kill` names and lets a new one join at `--join`; the survivors agree on a quorum every step,
redo the interrupted one without the dead replica, and heal the newcomer from a live peer. It prints what
each replica saw and the parity verdict against one process trained on the quorums' data
(`parity.survivors_reference`), and exits 1 if they differ. `goodput` starts nothing: the useful fraction
of a run under failures, checkpoint-restart (Daly's interval) against replicas that heal (`goodput`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import torch

from distlab import launch, parity, reference
from distlab.cli_types import add_json, add_seed, add_steps, at_least, positive_int
from distlab.fault_tolerance import goodput
from distlab.fault_tolerance import parity as ft_parity
from distlab.fault_tolerance.replicas import ReplicaConfig, ReplicaLog, run_replicas

SECONDS = at_least(0.0, float)


def event(text: str) -> tuple[int, int] | None:
    """An argparse `type=`: REPLICA:STEP (e.g. 2:2), or "none"."""
    if text.strip().lower() == "none":
        return None
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not REPLICA:STEP such as 2:2, or none")
    return int(parts[0]), int(parts[1])


def parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(prog="python -m distlab.fault_tolerance", description=__doc__.split("\n")[0],
                                formatter_class=fmt)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    h = sub.add_parser("heal", formatter_class=fmt, help="replicas that lose one and heal, checked",
                       description="kill one replica, let one join, check the run against one process")
    h.add_argument("--replicas", type=at_least(2), default=4, help="replica slots started as ranks")
    h.add_argument("--per-replica", type=positive_int, default=6, help="examples per replica per step")
    add_steps(h, 6, "training steps")
    h.add_argument("--kill", type=event, default=(2, 2), help="REPLICA:STEP to SIGKILL, or none")
    h.add_argument("--join", type=event, default=(3, 4), help="REPLICA:STEP that joins late, or none")
    add_seed(h, "seed of the weights and the data")
    add_json(h)
    g = sub.add_parser("goodput", formatter_class=fmt, help="checkpoint-restart against healing replicas",
                       description="useful fraction of a run under failures (no ranks)")
    g.add_argument("--failures-per-day", type=at_least(1e-6, float), default=20.0,
                   help="failures of the job per day")
    g.add_argument("--step-s", type=at_least(1e-6, float), default=2.0, help="seconds per training step")
    g.add_argument("--checkpoint-s", type=at_least(1e-6, float), default=60.0, help="seconds to write one")
    g.add_argument("--restart-s", type=SECONDS, default=300.0, help="seconds to restart from a checkpoint")
    g.add_argument("--detect-s", type=SECONDS, default=1.0, help="seconds to notice a dead replica")
    g.add_argument("--heal-s", type=SECONDS, default=10.0, help="seconds to send a replica the state")
    g.add_argument("--replace-s", type=SECONDS, default=300.0, help="seconds to start a replacement")
    g.add_argument("--replicas", type=at_least(2), default=8, help="replica groups that heal each other")
    add_json(g)
    return p


def heal(args: argparse.Namespace) -> dict[str, Any]:
    """Run the replicas and compare the run with one process on the quorums' data."""
    task = reference.mlp_task(sizes=(6, 11, 5), n=16 * args.replicas * args.per_replica, seed=args.seed)
    config = ReplicaConfig(replicas=args.replicas, per_replica=args.per_replica, steps=args.steps,
                           kill=args.kill, join=args.join, seed=args.seed)
    config.check()
    logs = run_replicas(task, config)
    alive = [log for log in logs if isinstance(log, ReplicaLog)]
    first = _first_finished(alive, logs, config)
    members = [first.members[t] for t in range(config.steps)]
    ours = [first.losses[t] for t in range(config.steps)]
    reports = _heal_reports(task, config, args.seed, alive, first, members, ours)
    return {"replicas": config.replicas, "steps": config.steps, "kill": config.kill, "join": config.join,
            "ended": {i: _ended(log, i, config) for i, log in enumerate(logs)
                      if isinstance(log, launch.RankError)},
            "members": [list(m) for m in members], "losses": ours,
            "redone_rounds": first.failed_rounds, "detect_s": first.detect_s,
            "heal_s": {log.replica: log.heal_s for log in alive if log.heal_s is not None},
            "verdicts": [r.verdict() for r in reports],
            "passed": all(r.passed for r in reports)}


def _first_finished(alive: list[ReplicaLog], logs: list, config: ReplicaConfig) -> ReplicaLog:
    """The first replica that committed every step, or a ValueError showing what each one did."""
    first = next((log for log in alive if len(log.losses) == config.steps), None)
    if first is None:
        raise ValueError(f"no replica finished all {config.steps} steps: {logs}")
    return first


def _heal_reports(task: Any, config: ReplicaConfig, seed: int, alive: list[ReplicaLog], first: ReplicaLog,
                  members: list, ours: list[float]) -> list[parity.ParityReport]:
    """`first` against one process on the quorums' data, then every other survivor against `first`."""
    ref = ft_parity.survivors_reference(task, members, config.per_replica, config.replicas, seed)
    report = parity.compare({"losses": ours, "parameters": first.params},
                            {"losses": ref.losses, "parameters": ref.params}, dtype=torch.float32,
                            label=f"replica {first.replica}", against="one process on the quorums' data")
    same = [parity.compare(log.params, first.params, dtype=torch.float32, label=f"replica {log.replica}",
                           against=f"replica {first.replica}") for log in alive if log is not first]
    return [report, *same]


def _ended(error: launch.RankError, replica: int, config: ReplicaConfig) -> str:
    """One line on a replica that did not finish: the kill this run asked for, or the rank's own error."""
    if config.kill and config.kill[0] == replica and "SIGKILL" in str(error):
        return f"SIGKILLed at step {config.kill[1]} as asked, reported by distlab.launch as a RankError"
    return str(error).splitlines()[0]


def goodput_table(args: argparse.Namespace) -> dict[str, Any]:
    """Checkpoint-restart and healing replicas under the same failure rate."""
    mtbf = goodput.mtbf_from_rate(args.failures_per_day)
    ckpt = goodput.checkpoint_goodput(mtbf, args.step_s, args.checkpoint_s, args.restart_s)
    healing = goodput.healing_goodput(mtbf, args.step_s, args.detect_s, args.heal_s, args.replicas,
                                      args.replace_s)
    return {"mtbf_s": mtbf, "checkpoint_restart": ckpt, "healing": healing}


def _print_heal(out: dict[str, Any]) -> None:
    print(f"{out['replicas']} replicas, {out['steps']} steps; killed (replica, step): {out['kill']}; "
          f"joining: {out['join']}")
    for replica, why in out["ended"].items():
        print(f"replica {replica}: {why}")
    print("quorum per step: " + ", ".join(f"{t}: {tuple(m)}" for t, m in enumerate(out["members"])))
    print(f"rounds redone without the dead replica: {out['redone_rounds'] or 'none'}")
    for v in out["verdicts"]:
        print(v)


def _print_goodput(out: dict[str, Any], args: argparse.Namespace) -> None:
    c, h = out["checkpoint_restart"], out["healing"]
    print(f"{args.failures_per_day:g} failures a day: one every {out['mtbf_s']:.0f} s; "
          f"steps of {args.step_s:g} s")
    print(f"checkpoint-restart: a {args.checkpoint_s:g} s checkpoint every {c['interval']:.0f} s of work "
          f"(Daly; Young: {c['young_interval']:.0f} s), {args.restart_s:g} s restarts: "
          f"{c['fraction']:.1%} useful, {c['steps_per_hour']:.0f} steps an hour")
    print(f"{args.replicas} replicas that heal: {h['lost_per_failure']:.1f} s lost per failure: "
          f"{h['fraction']:.1%} useful, {h['steps_per_hour']:.0f} steps an hour")


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        out = heal(args) if args.command == "heal" else goodput_table(args)
    except ValueError as e:
        p.error(str(e))
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    elif args.command == "heal":
        _print_heal(out)
    else:
        _print_goodput(out, args)
    return 0 if out.get("passed", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
