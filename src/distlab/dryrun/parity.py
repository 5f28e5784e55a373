"""Small worlds with values: the same step on real ranks equals one process, and sends what the dry run says.

A dry run computes no value, so what it proves is about shapes, calls and bytes. Whether the step it
ran is *correct* is the question of chapter 9's parity check, which only a world with values can answer.
`small_world_check(layout)` answers both questions for a layout of at most a few ranks:

1. it runs one step of the same trainer on `layout.world_size` real ranks (`distlab.launch.run`, gloo,
   float64) and compares the loss, the first-step gradients and the updated parameters with one process
   (`parallel3d.parity.parity_3d` against `reference_run`, `distlab.reference`'s trainer), a
   `distlab.parity` report within float64's tolerance;
2. it dry-runs every rank of the same layout in this process (fake world, meta device, same dtype) and
   checks that each rank's calls, per mesh axis and kind, and their bytes equal those of the real rank.

Together: the fake world runs the code that is correct, and records what that code sends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distlab import launch
from distlab.dryrun.layouts import DryLayout
from distlab.dryrun.run import dry_run
from distlab.mesh import grid
from distlab.models import GPTConfig
from distlab.parallel3d.config import Plan3D
from distlab.parallel3d.cost_model import Traffic
from distlab.parallel3d.parity import parity_3d, reference_run
from distlab.parallel3d.train import RankRun3D, make_batches, train_3d
from distlab.parity import ParityReport

__all__ = ["SmallWorld", "small_layout", "small_world_check"]

MAX_SMALL_WORLD = 8  # ranks started as processes; each imports torch, so more is slow on a laptop


@dataclass
class SmallWorld:
    """The parity report of the real ranks against one process, and, per rank, whether the dry run's
    transfers equal the real rank's (calls and bytes per axis and kind)."""

    parity: ParityReport
    same_traffic: list[bool]

    @property
    def passed(self) -> bool:
        return self.parity.passed and all(self.same_traffic)

    def verdict(self) -> str:
        n = len(self.same_traffic)
        calls = (f"the dry run records the same calls and bytes as the real run on all {n} ranks"
                 if all(self.same_traffic) else
                 f"the dry run differs from the real run on ranks "
                 f"{[r for r, same in enumerate(self.same_traffic) if not same]}")
        return f"{self.parity.verdict()}; {calls}"


def small_layout(dp: int, pp: int, tp: int, zero_stage: int = 1, m: int = 2, layers: int = 3,
                 hidden: int = 16, heads: int = 4, vocab: int = 32, seq: int = 8) -> DryLayout:
    """A layout small enough for real ranks: the course's GPT at toy size on (dp, pp, tp)."""
    config = GPTConfig(vocab_size=vocab, block_size=seq, n_layer=layers, n_head=heads, n_embd=hidden)
    plan = Plan3D(dp=dp, pp=pp, tp=tp, m=m, zero_stage=zero_stage)
    return DryLayout(f"small {plan.label()}", config, plan, dp * m, seq, "a toy GPT")


def _rank(layout: DryLayout, seed: int) -> RankRun3D:
    p = layout.plan
    mesh = grid(dp=p.dp, pp=p.pp, tp=p.tp)
    batches = make_batches(layout.config, layout.batch, layout.seq, 1, seed)
    return train_3d(mesh, layout.config, p, batches, seed=seed, dtype=torch.float64, device=launch.device())


def _calls(traffic: Traffic) -> dict[tuple[str, str], tuple[int, float]]:
    return {k: (t.calls, t.sent_bytes) for k, t in traffic.items()}


def small_world_check(layout: DryLayout, seed: int = 0) -> SmallWorld:
    """Run `layout` on real ranks and as dry runs, and compare (see the module docstring)."""
    if layout.world_size > MAX_SMALL_WORLD:
        raise ValueError(f"layout {layout.name} has {layout.world_size} ranks; a world with values starts "
                         f"one process per rank: use at most {MAX_SMALL_WORLD} (dry-run larger ones)")
    runs = launch.run(_rank, layout.world_size, layout, seed)
    batches = make_batches(layout.config, layout.batch, layout.seq, 1, seed)
    ref = reference_run(layout.config, batches, seed, dtype=torch.float64)
    report = parity_3d(runs, ref, layout.config, layout.plan, torch.float64)
    same = [_calls(dry_run(layout, r, dtype=torch.float64).traffic) == _calls(run.traffic)
            for r, run in enumerate(runs)]
    return SmallWorld(report, same)
