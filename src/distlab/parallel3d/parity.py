"""The 3D step against one process: the same GPT, seed, batches and Adam, compared shard by shard.

`reference_run` trains the dense `distlab.models.GPT` with `torch.optim.Adam` (which chapter 7's ZeRO
equals) on the whole batch, with the course's one single-process loop, `distlab.reference.train_reference`.
`parity_3d` cuts the reference's gradients and parameters into each rank's tensor-parallel shard with
chapter 5's `shard_state_dict` and compares them, by dense name, with what each rank returned; and the
loss of each step (the mean over the dp replicas of the last stage's loss) with the reference's loss, in
one `distlab.parity.ParityReport`. In float64 both sides add the same terms in other orders: differences
are a few 1e-16 relative, so float64's tolerance, 1e-10, is far above rounding and far below a real
mistake. A lab prints the report's `verdict()`, the claim against the tolerance, never the
machine-dependent error.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distlab.models import GPTConfig
from distlab.parallel3d.config import Plan3D
from distlab.parallel3d.train import RankRun3D, dense_gpt
from distlab.parity import ParityReport, compare
from distlab.reference import ReferenceRun, lm_loss, train_reference
from distlab.tensor_parallel import shard_state_dict


def reference_run(config: GPTConfig, batches: list[tuple[Tensor, Tensor]], seed: int = 0, lr: float = 1e-2,
                  dtype: torch.dtype = torch.float64) -> ReferenceRun:
    """Train the dense GPT in one process on the whole batches, with torch.optim.Adam: the loss per step,
    the gradients of the first step and the parameters after the last."""
    gpt = dense_gpt(config, seed, dtype)
    return train_reference(gpt, batches, lm_loss, torch.optim.Adam(gpt.parameters(), lr=lr))


def parity_3d(runs: list[RankRun3D], ref: ReferenceRun, config: GPTConfig, plan: Plan3D,
              dtype: torch.dtype = torch.float64) -> ParityReport:
    """Every rank's shards (first-step gradients, final parameters) and the replicas' mean loss of each
    step against the reference, within `dtype`'s tolerance."""
    ours: dict[str, dict] = {"first-step gradients": {}, "final parameters": {}}
    want: dict[str, dict] = {"first-step gradients": {}, "final parameters": {}}
    for i, run in enumerate(runs):
        tp_rank = run.coords["tp"]
        grads = shard_state_dict(ref.first_grads, config, tp_rank, plan.tp)
        params = shard_state_dict(ref.params, config, tp_rank, plan.tp)
        for name, p in run.params.items():
            ours["first-step gradients"][f"rank {i} {name}"] = run.first_grads[name]
            want["first-step gradients"][f"rank {i} {name}"] = grads[name]
            ours["final parameters"][f"rank {i} {name}"] = p
            want["final parameters"][f"rank {i} {name}"] = params[name]
    replicas = [r.losses for r in runs if r.losses is not None]
    ours = {"losses": [sum(step) / len(step) for step in zip(*replicas, strict=True)]} | ours
    want = {"losses": ref.losses} | want
    return compare(ours, want, dtype=dtype, label=plan.label(), against="one process")
