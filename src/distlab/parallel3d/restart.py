"""Train under torchrun, checkpoint every k steps, and resume from the newest checkpoint after a restart.

    torchrun --standalone --nproc-per-node 4 --max-restarts 1 -m distlab.parallel3d.restart \\
        --dp 1 --pp 2 --tp 2 --steps 8 --every 3 --kill-at-step 5 --dir /tmp/run

It trains the 3D-parallel GPT (`train.Trainer3D` on `grid(dp=, pp=, tp=)`, ZeRO stage 2 over dp) on
`checkpoint.train`'s model and data, so its losses equal `checkpoint.train.reference_losses`.

Each attempt (torchrun's `TORCHELASTIC_RESTART_COUNT`: 0, then 1, ...) starts by loading the newest
complete checkpoint under `--dir`, if there is one, and trains up to `--steps`, saving after every
`--every` steps. `--kill-at-step S` is the fault: on the first attempt only, rank `--kill-rank` sends
itself SIGKILL just before step S, as a crashed GPU or a lost node would end it, without a word. The
torchrun agent sees a worker die, stops the others and starts the whole group again (Elastic Horovod
and torchrun restart the group rather than the one rank: the survivors' state is mid-collective). A
survivor whose collective fails on the lost peer says so in one line and waits for torchrun to stop it.

The work lost is every step done after the last checkpoint: S - (S // every) * every steps. `--dir` is
made if it does not exist. Rank 0 appends one JSON line per step to `--dir/losses.jsonl` (torchrun's run
id, attempt, step, loss) and, at the end, writes `--dir/report.json` and prints a summary of the run
(`summarize`, `describe`: attempts, the step it resumed from, the steps lost, the last loss).
`--report-dir` makes every rank also write where it ran (torchrun's GROUP_RANK, LOCAL_RANK) and its tp
peers, for the many-node test. A fault that could not happen is refused, not skipped: `--kill-rank`
outside the world, `--kill-at-step` at or past `--steps`, or a `--dir` whose newest checkpoint is
already past `--kill-at-step`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from distlab.parallel3d import checkpoint
from distlab.parallel3d.checkpoint.train import TrainConfig, dataset, global_batch
from distlab.parallel3d.config import Plan3D
from distlab.parallel3d.train import Trainer3D


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m distlab.parallel3d.restart",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dp", type=int, default=2, help="data-parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (the outer mesh dim)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (the inner mesh dim)")
    p.add_argument("--micro-batches", type=int, default=1, help="micro-batches per step (the pipeline's m)")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps to train in all")
    p.add_argument("--every", type=int, default=3, help="checkpoint after every this many steps (0: never)")
    p.add_argument("--kill-at-step", type=int, default=-1, help="first attempt: SIGKILL before this step")
    p.add_argument("--kill-rank", type=int, default=1, help="the rank that kills itself")
    p.add_argument("--dir", required=True, help="where checkpoints and the loss log go")
    p.add_argument("--report-dir", default=None, help="every rank writes rank_<r>.json here")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    args = p.parse_args(argv)
    for name in ("dp", "pp", "tp", "micro_batches", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if args.every < 0:
        p.error(f"--every={args.every} must be 0 (no checkpoints) or a positive number of steps")
    world = args.dp * args.pp * args.tp
    if args.kill_at_step >= args.steps or args.kill_at_step < -1:
        p.error(f"--kill-at-step={args.kill_at_step} would inject no fault: use a step from 0 to --steps - 1 "
                f"= {args.steps - 1}, or -1 for none")
    if args.kill_at_step >= 0 and not 0 <= args.kill_rank < world:
        p.error(f"--kill-rank={args.kill_rank} is not a rank of the dp x pp x tp = {world} ranks; use one "
                f"from 0 to {world - 1}")
    return args


def placement(mesh: object) -> dict:
    """Where this rank runs (torchrun's node and local rank) and the global ranks of its tp group."""
    tp_group = mesh["tp"].get_group()  # type: ignore[index]
    return {"rank": dist.get_rank(), "group_rank": int(os.environ.get("GROUP_RANK", 0)),
            "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
            "tp_peers": dist.get_process_group_ranks(tp_group)}


def init(attempt: int) -> None:
    """Join the process group of this attempt. Its store keys get the attempt as a prefix, so that no
    rank of attempt 1 reads an address a rank of attempt 0 published there (gloo would try to connect
    to a process that is gone)."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def main(argv: list[str] | None = None) -> None:
    """One attempt of the job: resume, train, checkpoint, maybe die (see the module docstring)."""
    args = parse_args(argv)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    torch.set_default_dtype(torch.float64)
    init(attempt)
    try:
        cfg = TrainConfig(seed=args.seed)
        plan = Plan3D(dp=args.dp, pp=args.pp, tp=args.tp, m=args.micro_batches, zero_stage=cfg.zero_stage)
        mesh = plan.layout.mesh()
        trainer = Trainer3D(mesh, cfg.gpt(), plan, cfg.batch_size, cfg.block_size, cfg.seed, cfg.lr)
        data = dataset(cfg)
        root = Path(args.dir)
        root.mkdir(parents=True, exist_ok=True)
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
        resumed = _resume(trainer, mesh, root, args.kill_at_step)
        log, losses = root / "losses.jsonl", []
        while trainer.step < args.steps:
            step = trainer.step
            loss = _train_step(trainer, cfg, data, args, attempt)
            losses.append(loss)
            if dist.get_rank() == 0:
                with log.open("a") as fh:
                    row = {"run": run_id, "attempt": attempt, "step": step, "loss": loss}
                    fh.write(json.dumps(row) + "\n")
            if args.every and trainer.step % args.every == 0 and trainer.step < args.steps:
                checkpoint.save(trainer, mesh, checkpoint.step_dir(root, trainer.step))
        _report(args.report_dir, mesh, losses, root,
                {"run": run_id, "attempt": attempt, "resumed_from": resumed})
        trainer.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _resume(trainer: Trainer3D, mesh: object, root: Path, kill_at_step: int) -> int:
    """Load the newest checkpoint under `root`, if any, refusing one already past the fault; the step it
    ends (0: none)."""
    found = checkpoint.latest(root)
    if found is not None and kill_at_step >= 0 and _step_of(found) > kill_at_step:
        raise SystemExit(f"--kill-at-step={kill_at_step}: the newest checkpoint in --dir={root} is "
                         f"{found.name}, past the fault, so this run would inject nothing; use a fresh "
                         "--dir (or delete this one)")
    return checkpoint.load(trainer, mesh, found) if found is not None else 0


def _train_step(trainer: Trainer3D, cfg: TrainConfig, data: torch.Tensor, args: argparse.Namespace,
                attempt: int) -> float:
    """One step and its global loss; the injected fault kills rank --kill-rank first, on attempt 0."""
    if attempt == 0 and trainer.step == args.kill_at_step and dist.get_rank() == args.kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    step = trainer.step
    try:
        return trainer.global_loss(trainer.train_step(*global_batch(cfg, data, step)))
    except RuntimeError as lost:
        if attempt > 0 or args.kill_at_step < 0:
            raise
        _await_restart(lost, step, args.kill_rank)


def _report(report_dir: str | None, mesh: object, losses: list[float], root: Path, run: dict) -> None:
    """Every rank's placement and losses under `report_dir` (None: not written); rank 0's report.json
    (`run`: run id, attempt, resumed_from) and its printed summary."""
    if report_dir is not None:
        out = Path(report_dir) / f"rank_{dist.get_rank()}.json"
        out.write_text(json.dumps({**placement(mesh), "losses": losses}))
    if dist.get_rank() == 0:
        (root / "report.json").write_text(json.dumps(run))
        print(describe(summarize(root), root), flush=True)


def _await_restart(lost: RuntimeError, step: int, kill_rank: int, wait: float = 60.0) -> NoReturn:
    """A surviving rank's collective failed because the injected fault killed its peer: say so in one
    line (not gloo's traceback, "Connection reset by peer ... GLHF") and wait for torchrun, which has seen
    the SIGKILL, to stop this rank and restart the group. If torchrun has not stopped it within `wait`
    seconds, the failure was something else: raise it."""
    peer = re.search(r"Connection (reset|closed) by peer", str(lost))
    why = peer.group(0) if peer else str(lost).splitlines()[0][:120]
    print(f"rank {dist.get_rank()}: step {step} stopped, a peer is gone ({why}): rank {kill_rank} was "
          "killed by the injected fault; torchrun restarts the group", file=sys.stderr, flush=True)
    time.sleep(wait)
    raise lost


def _step_of(path: Path) -> int:
    return int(path.name.removeprefix("step_"))


def summarize(directory: str | os.PathLike) -> dict:
    """What the last run under `directory` did (the lines of its torchrun run id): the final loss curve
    (the last attempt's value for each step), the attempts, the step it resumed from, and the steps
    lost (done, then redone after the restart)."""
    root = Path(directory)
    report = json.loads((root / "report.json").read_text())
    rows = [json.loads(line) for line in (root / "losses.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("run", "") == report.get("run", "")]
    curve: dict[int, float] = {}
    for r in rows:
        curve[r["step"]] = r["loss"]
    done_before = [r["step"] for r in rows if r["attempt"] < report["attempt"]]
    lost = sum(1 for s in done_before if s >= report["resumed_from"])
    return {"losses": [curve[s] for s in sorted(curve)], "attempts": report["attempt"] + 1,
            "resumed_from": report["resumed_from"], "steps_lost": lost,
            "killed_at": max(done_before) + 1 if done_before else None}


def describe(run: dict, directory: str | os.PathLike) -> str:
    """The run's summary in words (what `main` prints last): attempts, fault, resume, steps lost."""
    steps = len(run["losses"])
    lines = [f"distlab.parallel3d.restart: {steps} steps done in {run['attempts']} attempt(s); "
             f"final loss {run['losses'][-1]:.4f}" if steps else "distlab.parallel3d.restart: no steps done"]
    if run["killed_at"] is not None:
        lines.append(f"  attempt 1 died before step {run['killed_at']}: the injected fault killed one rank "
                     "(torchrun's 'exitcode: -9' above), the others lost their peer, and torchrun "
                     "restarted the group")
    if run["resumed_from"]:
        lines.append(f"  the last attempt resumed from the checkpoint after step {run['resumed_from']}: "
                     f"{run['steps_lost']} step(s) done twice")
    lines.append(f"  losses and checkpoints are in {Path(directory)}/")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
