"""Chapter 9's checkpoints with chapter 7's `ShardedOptimizer` (ZeRO-2 around torch.optim.Adam) over dp.

Three launches, each resuming the one before from its checkpoint on fewer dp ranks: grid(dp=3, tp=1)
trains steps 0-2 and saves; grid(dp=2, tp=1) loads it, trains steps 3-5 and saves after step 4 (and,
in the same ranks, grid(dp=1, tp=2) loads the dp = 3 checkpoint too: the tp dim resharded as well);
grid(dp=1, tp=1) loads the dp = 2 checkpoint and trains steps 4-5. The optimizer's state goes through
its state dicts (`checkpoint.sharded_state`): whole over dp in the checkpoint, cut into the new dp
size's slices on load. Every loss, and the final parameters, equal one process that never stopped
(`torch.optim.Adam` on the whole batch), within float64's `distlab.parity.TOLERANCE`: the meshes add
the same gradients in another order. A negative control (the dp = 2 run without the optimizer's state)
differs, and a checkpoint with bytes flipped in Adam's state is refused by name on every rank.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from distlab import launch, mesh, parity
from distlab.parallel3d import checkpoint
from distlab.parallel3d.checkpoint.train import TrainConfig, Trainer, reference_run
from tests.parallel3d.checkpoint.test_parallel3d_checkpoint import _flip, _train  # shared helpers

CFG = TrainConfig(optimizer="sharded")
STEPS = 6
KEY = "optim.exp_avg_sq.h.1.mlp.c_fc.weight"


def _dp3(root: str) -> dict:
    torch.set_default_dtype(torch.float64)
    m = mesh.grid(dp=3, tp=1)
    losses = _train(Trainer(CFG, m), 3, (3, Path(root) / "dp3"), m)
    if torch.distributed.get_rank() == 0:  # a copy with 8 bytes of Adam's exp_avg_sq flipped
        _flip(Path(shutil.copytree(Path(root) / "dp3", Path(root) / "flipped")), KEY, 8)
    torch.distributed.barrier()
    return losses


def _dp2(root: str) -> dict:
    torch.set_default_dtype(torch.float64)
    out: dict = {}
    m = mesh.grid(dp=2, tp=1)
    trainer = Trainer(CFG, m)
    out["resumed_at"] = checkpoint.load(trainer, m, Path(root) / "dp3")
    out["dp2"] = _train(trainer, STEPS, (4, Path(root) / "dp2"), m)
    m12 = mesh.grid(dp=1, tp=2)
    trainer = Trainer(CFG, m12)
    checkpoint.load(trainer, m12, Path(root) / "dp3")
    out["dp1 tp2"] = _train(trainer, STEPS)
    forgetful = Trainer(CFG, m)  # the parameters come back, Adam's state is dropped
    checkpoint.load(forgetful, m, Path(root) / "dp3")
    forgetful.opt.optim.state.clear()
    out["forgetful"] = _train(forgetful, 5)
    try:
        checkpoint.load(Trainer(CFG, m), m, Path(root) / "flipped")
        out["flipped"] = None
    except checkpoint.CheckpointError as e:
        out["flipped"] = str(e)
    return out


def _dp1(root: str) -> dict:
    torch.set_default_dtype(torch.float64)
    m = mesh.grid(dp=1, tp=1)
    trainer = Trainer(CFG, m)
    resumed_at = checkpoint.load(trainer, m, Path(root) / "dp2")
    losses = _train(trainer, STEPS)
    return {"resumed_at": resumed_at, "dp1": losses,
            "params": {p.name: p.local.detach().clone() for p in trainer.params()}}


@functools.cache
def _runs() -> tuple[list[dict], list[dict], dict]:
    root = tempfile.mkdtemp()
    try:
        return launch.run(_dp3, 3, root), launch.run(_dp2, 2, root), launch.run(_dp1, 1, root)[0]
    finally:
        shutil.rmtree(root)


@functools.cache
def _reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return reference_run(CFG, STEPS)
    finally:
        torch.set_default_dtype(old)


def _agrees(curve: dict[int, float], label: str) -> parity.ParityReport:
    want = _reference()[0]
    return parity.compare(curve, {s: want[s] for s in curve}, dtype=torch.float64, name="losses",
                          label=label, against="one process")


def test_dp3_to_dp2_to_dp1_equals_one_process_that_never_stopped():
    dp3, dp2, dp1 = _runs()
    assert all(sorted(r) == [0, 1, 2] for r in dp3)
    _agrees(dp3[0], "dp = 3, steps 0-2").assert_passed()
    for r in dp2:
        assert r["resumed_at"] == 3 and sorted(r["dp2"]) == [3, 4, 5]
        _agrees(r["dp2"], "dp = 3 -> 2, steps 3-5").assert_passed()
        _agrees(r["dp1 tp2"], "dp = 3 -> (dp 1, tp 2), steps 3-5").assert_passed()
    assert dp1["resumed_at"] == 4 and sorted(dp1["dp1"]) == [4, 5]
    _agrees(dp1["dp1"], "dp = 2 -> 1, steps 4-5").assert_passed()
    params = _reference()[1]
    assert sorted(dp1["params"]) == sorted(params)
    parity.compare(dp1["params"], params, dtype=torch.float64, name="parameters",
                   label="dp = 3 -> 2 -> 1, after 6 steps", against="one process").assert_passed()


def test_a_resume_without_the_optimizer_state_differs():
    forgetful = _runs()[1][0]["forgetful"]
    want = _reference()[0]
    assert abs(forgetful[3] - want[3]) < parity.TOLERANCE[torch.float64]  # the parameters came back
    assert abs(forgetful[4] - want[4]) > 1e3 * parity.TOLERANCE[torch.float64]


def test_flipped_bytes_in_the_optimizer_state_are_refused_by_name_on_every_rank():
    for r in _runs()[1]:
        message = r["flipped"]
        assert message is not None, "loaded silently"
        for needle in ("flipped/", "is damaged", f"key {KEY!r}", "CRC-32", "nothing was loaded"):
            assert needle in message, (needle, message)


def test_an_unknown_optimizer_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="optimizer='lamb' is unknown; choose 'engine'"):
        TrainConfig(optimizer="lamb")
