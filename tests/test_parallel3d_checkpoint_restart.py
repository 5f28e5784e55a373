"""Chapter 9, part 5: a rank killed mid-training, torchrun restarts the group, nothing is lost.

`torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m distlab.parallel3d.restart` trains the
3D-parallel GPT (`Trainer3D`) at grid(dp=1, pp=2, tp=1) with 2 micro-batches (2 ranks, the smallest
mesh with a pipeline: each stage checkpoints its own layers, the last stage's tied embedding is not
written twice), checkpointing after every 3 steps; rank 1 (the last stage) sends itself SIGKILL before
step 5 on the first attempt. The second attempt resumes from the
checkpoint after step 3, redoes steps 3 and 4, and finishes. Its loss curve equals the single-process
reference within 1e-10 (float64; see test_parallel3d_checkpoint.py for the tolerance).
"""

from __future__ import annotations

import torch

from distlab.parallel3d.checkpoint.train import TrainConfig, reference_losses
from distlab.parallel3d.multinode import run_standalone
from distlab.parallel3d.restart import parse_args, summarize

STEPS, EVERY, KILL_AT = 8, 3, 5


def test_killed_rank_restarts_from_the_last_checkpoint_with_the_same_losses(tmp_path):
    args = ["-m", "distlab.parallel3d.restart", "--dp", "1", "--pp", "2", "--tp", "1",
            "--micro-batches", "2", "--steps", str(STEPS), "--every", str(EVERY),
            "--kill-at-step", str(KILL_AT), "--dir", str(tmp_path)]
    log = run_standalone(args, nproc=2, max_restarts=1, timeout=240)
    assert "exitcode: -9" in log  # the agent saw the worker die of SIGKILL, then restarted the group
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
