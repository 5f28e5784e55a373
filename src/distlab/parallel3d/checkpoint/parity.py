"""Resume on other meshes and compare: the rank function the checkpoint lab runs, and its verdict.

`resume_on_meshes` (run on 4 ranks by `distlab.launch.run`) trains without a break at grid(dp=2, tp=2),
saving after `save_at` steps, then loads that checkpoint at each target mesh and trains on. `verdict`
compares every curve with the single-process reference (`checkpoint.train.reference_losses`) with
`distlab.parity.compare`, within float64's `distlab.parity.TOLERANCE` (1e-10): float64 sums in another
order differ by a few 2**-53 per step; a lost optimizer state or a misplaced shard moves the loss by
~1e-3.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from distlab import mesh as meshes
from distlab.parallel3d import checkpoint
from distlab.parallel3d.checkpoint.train import TrainConfig, Trainer, reference_losses
from distlab.parity import compare


def train_to(trainer: Trainer, steps: int, save_at: int | None = None, path: Path | None = None,
             mesh: object = None) -> dict[int, float]:
    """Train up to `steps` steps; after `save_at` steps save a checkpoint to `path`. {step: loss}."""
    losses = {}
    while trainer.step < steps:
        step = trainer.step
        losses[step] = trainer.train_step()
        if save_at is not None and trainer.step == save_at:
            checkpoint.save(trainer, mesh, path)  # type: ignore[arg-type]
    return losses


def resume_on_meshes(root: str, steps: int = 8, save_at: int = 3,
                     targets: Sequence[tuple[int, int]] = ((4, 1), (1, 4))) -> dict:
    """On 4 ranks: the uninterrupted (2, 2) run and, per (dp, tp) target, the run resumed from its
    checkpoint. Returns {"full": {step: loss}, "dp=4 tp=1": {step: loss}, ...}."""
    torch.set_default_dtype(torch.float64)
    path = Path(root) / f"step_{save_at:06d}"
    m = meshes.grid(dp=2, tp=2)
    out = {"full": train_to(Trainer(TrainConfig(), m), steps, save_at, path, m)}
    for dp, tp in targets:
        m = meshes.grid(dp=dp, tp=tp)
        trainer = Trainer(TrainConfig(), m)
        checkpoint.load(trainer, m, path)
        out[f"resumed at dp={dp} tp={tp}"] = train_to(trainer, steps)
    return out


def verdict(curves: dict[str, dict[int, float]]) -> list[str]:
    """One line per curve ({label: {step: loss}}): does it equal the single-process reference within
    float64's tolerance? A failing line names the steps whose loss differs."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ref = reference_losses(TrainConfig(), 1 + max(max(c) for c in curves.values()))
    finally:
        torch.set_default_dtype(old)
    return [compare(curve, {s: ref[s] for s in curve}, dtype=torch.float64, name="losses",
                    label=f"{label}, steps {min(curve)}-{max(curve)}", against="one process").verdict()
            for label, curve in curves.items()]
