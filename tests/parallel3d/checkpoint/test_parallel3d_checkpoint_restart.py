"""Chapter 9, part 5: a rank killed mid-training, torchrun restarts the group, nothing is lost.

The command is README's, read from README.md and run as written (torchrun as `python -m
torch.distributed.run`) in a fresh directory, so its relative `--dir ckpt` does not exist yet; it must
end with the run's summary. `torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m
distlab.parallel3d.restart` trains the
3D-parallel GPT (`Trainer3D`) at grid(dp=1, pp=2, tp=1) with 2 micro-batches (2 ranks, the smallest
mesh with a pipeline: each stage checkpoints its own layers, the last stage's tied embedding is not
written twice), checkpointing after every 3 steps; rank 1 (the last stage) sends itself SIGKILL before
step 5 on the first attempt. The second attempt resumes from the
checkpoint after step 3, redoes steps 3 and 4, and finishes. Its loss curve equals the single-process
reference within 1e-10 (float64; see test_parallel3d_checkpoint.py for the tolerance).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from distlab.parallel3d.checkpoint.train import TrainConfig, reference_losses
from distlab.parallel3d.multinode import run_standalone
from distlab.parallel3d.restart import parse_args, summarize

STEPS, EVERY, KILL_AT = 8, 3, 5
ROOT = Path(__file__).resolve().parents[3]


def _readme_command() -> list[str]:
    """README's restart command, split into words."""
    readme = (ROOT / "README.md").read_text()
    found = re.findall(r"`(torchrun [^`]*-m distlab\.parallel3d\.restart[^`]*)`", readme)
    assert len(found) == 1, found
    return shlex.split(found[0])


def test_killed_rank_restarts_from_the_last_checkpoint_with_the_same_losses(tmp_path):
    """README's command, run as written from a fresh directory."""
    words = _readme_command()
    assert words[:2] == ["torchrun", "--standalone"] and words[words.index("--dir") + 1] == "ckpt"
    nproc = int(words[words.index("--nproc-per-node") + 1])
    restarts = int(words[words.index("--max-restarts") + 1])
    module_args = words[words.index("-m"):]
    args = parse_args(module_args[2:])
    assert (args.steps, args.every, args.kill_at_step) == (STEPS, EVERY, KILL_AT)
    assert args.dp * args.pp * args.tp == nproc
    log = run_standalone(module_args, nproc=nproc, max_restarts=restarts, timeout=240, cwd=tmp_path)
    assert "exitcode: -9" in log  # the agent saw the worker die of SIGKILL, then restarted the group
    tmp_path = tmp_path / "ckpt"  # made by the script
    tail = log.strip().splitlines()[-4:]
    assert tail[0].startswith(f"distlab.parallel3d.restart: {STEPS} steps done in 2 attempt(s); final loss")
    assert f"attempt 1 died before step {KILL_AT}: the injected fault killed one rank" in tail[1]
    # The survivor's failed collective is one line that names the fault, not gloo's traceback (issue 38,
    # D10: "Connection reset by peer ... GLHF" and twenty lines of stack before the summary).
    assert "Traceback" not in log and "GLHF" not in log, log
    assert f"rank 0: step {KILL_AT} stopped, a peer is gone (Connection " in log, log
    assert "resumed from the checkpoint after step 3: 2 step(s) done twice" in tail[2]
    assert tail[3] == "  losses and checkpoints are in ckpt/"
    run = summarize(tmp_path)
    assert run["attempts"] == 2
    assert run["killed_at"] == KILL_AT
    assert run["resumed_from"] == (KILL_AT // EVERY) * EVERY == 3
    assert run["steps_lost"] == KILL_AT - run["resumed_from"] == 2
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        want = reference_losses(TrainConfig(), STEPS)
    finally:
        torch.set_default_dtype(old)
    assert len(run["losses"]) == STEPS
    assert all(abs(a - b) < 1e-10 for a, b in zip(run["losses"], want, strict=True))
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000003", "step_000006"]


def test_restart_options_are_checked(capsys):
    for argv, needle in ((["--dir", "d", "--dp", "0"], "--dp=0 must be at least 1"),
                         (["--dir", "d", "--pp", "0"], "--pp=0 must be at least 1"),
                         (["--dir", "d", "--every", "-2"], "--every=-2 must be 0")):
        try:
            parse_args(argv)
        except SystemExit as e:
            assert e.code == 2
        assert needle in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "needle"), [
    (["--kill-at-step", "99"], "--kill-at-step=99 would inject no fault: use a step from 0 to "
                               "--steps - 1 = 7"),
    (["--kill-at-step", "-5"], "--kill-at-step=-5 would inject no fault"),
    (["--kill-at-step", "5", "--kill-rank", "7"], "--kill-rank=7 is not a rank of the dp x pp x tp = 4 "
                                                  "ranks; use one from 0 to 3"),
    (["--kill-at-step", "5", "--kill-rank", "-1"], "--kill-rank=-1 is not a rank"),
])
def test_a_fault_that_cannot_happen_is_refused(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--dir", "d", "--steps", "8", *argv])
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_readme_commands_write_only_where_git_ignores():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git work tree")
    for path in ("ckpt/step_000003/.metadata", "ckpt/losses.jsonl", "assets/hardware/MACHINE.json"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert done.returncode == 0, f"{path} would show as an untracked file"
    readme = (ROOT / "README.md").read_text()
    assert "--dir ckpt" in readme and "--out assets/hardware/MACHINE.json" in readme
