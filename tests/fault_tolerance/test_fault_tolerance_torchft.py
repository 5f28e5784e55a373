"""Section 4 of chapter 11: our local SGD, DiLoCo and streaming DiLoCo against torchft's `LocalSGD` and
`DiLoCo` (the same pseudo-gradients and outer steps on the same seed, over several outer steps), and
torchft's `Manager` with its lighthouse on 127.0.0.1 when one replica is SIGKILLed mid-step.

Skipped when torchft (the chapter's optional extra, `pip install -e '.[torchft]'`) is not installed.
"""

from __future__ import annotations

import glob
import os
import tempfile

import pytest
import torch

pytest.importorskip("torchft")

from distlab import launch, parity, reference
from distlab.fault_tolerance.quorum_kill import torchft_kill_experiment
from distlab.fault_tolerance.replica_loop import Recipe
from distlab.fault_tolerance.torchft_compare import GroupManager, our_run, torchft_run

STEPS = 9
RECIPES = {  # local SGD: 4 averages; DiLoCo: 3 outer steps; streaming (K=2, H=4): a fragment every 2 steps
    "local_sgd": Recipe("local_sgd", 2),
    "diloco": Recipe("diloco", 3),
    "streaming": Recipe("streaming", 4, fragments=2),
}


def _both_implementations() -> dict[str, tuple]:
    task = reference.gpt_task(n_layer=1, n_embd=16, block_size=8, n=60)
    return {name: (torchft_run(recipe, task, STEPS, 12, seed=2), our_run(recipe, task, STEPS, 12, seed=2))
            for name, recipe in RECIPES.items()}


def test_ours_takes_the_same_outer_steps_as_torchft() -> None:
    runs = launch.run(_both_implementations, 2, timeout=120.0)
    for rank, by_method in enumerate(runs):
        for name, (theirs, ours) in by_method.items():
            label = f"{name}, replica {rank}"
            assert len(ours.params) == len(theirs.params) >= 3, (
                f"{label}: ours took {len(ours.params)} outer steps, torchft {len(theirs.params)}")
            assert len(ours.pseudo_gradients) == len(theirs.pseudo_gradients)
            report = parity.compare(ours.flat(), theirs.flat(), dtype=torch.float64, label=label,
                                    against="torchft")
            report.assert_passed()


def test_group_manager_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="should_quantize=True needs torchft's Triton kernels"):
        GroupManager().allreduce(torch.zeros(2), should_quantize=True)


def test_torchft_quorum_drops_a_killed_replica_and_trains_on() -> None:
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "distlab-torchft-*")))
    reports = torchft_kill_experiment(replicas=3, kill_at=3, steps=7)
    assert len(reports) == 2
    for report in reports:
        assert (report.participants_before, report.participants_after) == (3, 2), report
        assert report.steps_lost >= 1, f"the step the victim died in should not commit: {report}"
        assert report.final_step >= 7 and report.seconds_to_recover > 0, report
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "distlab-torchft-*"))) == before
