"""The peak of one training step of chapter 6's folded MoE block on a rank, measured, beside its prediction
(`estimate.moe_step_peak`).

A step is the one every trainer runs: `zero_grad(set_to_none=True)`, forward, the loss
sum(y w) + 0.01 aux + 0.001 z (w fixed, outside the step), backward, `reduce_gradients` (the dp, tp and
edp all-reduces of `FoldedMoEBlock`), Adam's step. `accounting.measure_step` counts it with `LiveBytes`;
`warmup=0` measures the first step (Adam makes its state inside it), `warmup=1` a later one.

Why a plain `LiveBytes` moves by a few hundred bytes from run to run on gloo: `ProcessGroupGloo` runs a
collective on a worker thread of its own, which holds the work (and so the collective's tensors) until it
drops it after marking the work complete (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp,
`ProcessGroupGloo::runLoop`: `workInProgress_[workerIndex].reset()` comes after `execute`, which sets the
work's future). `wait()` returns as soon as the future is set, so a tensor whose
last Python reference went at the collective (the clone that `g` all-reduces, the buffer an all-to-all
sent) is freed whenever that thread gets there: a few ops later in some runs, at once in others, and a
peak that falls in those few ops sees it or not. The backend's ownership cannot be read from Python
while the caller still holds the work (the tensors' use counts include the work's references until both
the caller and the worker have let go of it), so `SettledLiveBytes` pauses `SETTLE_S` after each
collective, which gives gloo's thread the time to drop it; the step then frees every tensor where its last
reference goes, as it would without the backend's thread, and the same step measured twice has the same
peak to the byte on a machine whose cores are free enough for that thread to run within the pause (a
wait, not a guarantee: tests/memory/estimate/test_moe_step_peak.py holds repeats within 1 %). The pause
costs about 1.5 s a measured step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from distlab.memory.measure.accounting import LiveBytes, StepMemory, measure_step

AUX_WEIGHT, Z_WEIGHT = 0.01, 0.001
SETTLE_S = 0.05  # the pause after a collective, for gloo's worker thread to drop the finished work


class SettledLiveBytes(LiveBytes):
    """`LiveBytes` that lets gloo's worker thread drop a finished collective before the step goes on
    (module docstring), and remembers the op whose output made the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.op = ""
        self.peak_op = ""  # the op whose output made the peak, and that output's bytes
        self.peak_op_bytes = 0

    def _add(self, t: Tensor) -> None:
        peak = self.peak
        super()._add(t)
        if self.peak > peak:
            self.peak_op, self.peak_op_bytes = self.op, t.untyped_storage().nbytes()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.op = func.__name__
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func.namespace == "c10d":
            time.sleep(SETTLE_S)  # gloo's worker drops the finished work (module docstring)
        return out


@dataclass(frozen=True)
class MoEStepCase:
    """One measured step: the folding (tp, ep over `world` ranks), routing (k, capacity factor), dtype,
    Adam's implementation, first step or a later one, and the block's (small) shape."""

    world: int
    tp: int
    ep: int
    k: int = 2
    capacity_factor: float = 4.0
    dtype: str = "float32"
    adam: str = "for-loop"
    first_step: bool = False
    batch: int = 4
    seq: int = 16
    hidden: int = 16
    heads: int = 4
    ffn: int = 32
    experts: int = 8

    def label(self) -> str:
        step = "first step" if self.first_step else "later step"
        ranks = "1 rank" if self.world == 1 else f"{self.world} ranks"
        return (f"{ranks}, tp={self.tp}, ep={self.ep}, top-{self.k}, capacity "
                f"{self.capacity_factor}, {self.dtype}, Adam {self.adam}, {step}")


# The grid the tests hold and the book's table shows, by world size: tp 1/2, ep 1/2/3/4, top-1 and top-2,
# capacity 1.0 (drops tokens under these batches' uneven routing) and 4.0 (drops none), fp32 and bf16,
# Adam's for-loop, foreach and fused forms, the first step and a later one; peaks in forward, backward
# and the optimizer's step.
GRID = {
    1: [MoEStepCase(1, 1, 1, k=1),
        MoEStepCase(1, 1, 1, k=2, dtype="bfloat16", adam="foreach", first_step=True),
        MoEStepCase(1, 1, 1, k=2, adam="fused", batch=2, seq=6, ffn=64)],
    2: [MoEStepCase(2, 2, 2, k=2, capacity_factor=1.0),
        MoEStepCase(2, 1, 2, k=1, capacity_factor=1.0, dtype="bfloat16", first_step=True),
        MoEStepCase(2, 2, 1, k=2, adam="foreach", batch=2, seq=6, ffn=24)],
    3: [MoEStepCase(3, 1, 3, k=2, capacity_factor=1.0, experts=6, adam="foreach"),
        MoEStepCase(3, 1, 1, k=1, dtype="bfloat16")],
    4: [MoEStepCase(4, 2, 4, k=2, capacity_factor=1.0),
        MoEStepCase(4, 2, 2, k=1, dtype="bfloat16", adam="foreach", first_step=True),
        MoEStepCase(4, 1, 4, k=2, batch=2, seq=6, ffn=24)],
}


def measure_moe_step(case: MoEStepCase) -> dict:
    """On a rank (inside `launch.run(fn, case.world)`): the measured `StepMemory` of one step of the folded
    block, and what the router did (this rank's kept assignments per expert), for the prediction."""
    import torch.distributed as dist

    from distlab import launch
    from distlab.memory.estimate.optimizer_step import adam_kwargs
    from distlab.moe.folded_block import FoldedMoEBlock, MoEBlock
    from distlab.moe.folding import fold_meshes

    dtype, dev = getattr(torch, case.dtype), launch.device()  # CPU on gloo, the rank's GPU on NCCL
    meshes = fold_meshes(tp=case.tp, ep=case.ep, num_heads=case.heads, num_experts=case.experts)
    torch.manual_seed(0)
    ref = MoEBlock(case.hidden, case.heads, case.ffn, case.experts, case.k, case.capacity_factor)
    ref = ref.to(dev, dtype)
    block = FoldedMoEBlock.from_reference(ref, meshes)
    gen = torch.Generator().manual_seed(1 + dist.get_rank() // case.tp)  # one batch per dp replica
    x = torch.randn(case.batch, case.seq, case.hidden, generator=gen).to(dev, dtype)
    w = torch.randn(case.batch, case.seq, case.hidden, generator=gen).to(dev, dtype)
    optimizer = torch.optim.Adam(block.parameters(), lr=1e-3, **adam_kwargs(case.adam))
    seen: dict[str, list[int]] = {}

    def loss_fn(model: FoldedMoEBlock) -> Tensor:
        out = model(x)
        seen["counts"] = out.routings[0].tokens_per_expert().tolist()
        return (out.y * w).sum() + AUX_WEIGHT * out.aux_loss + Z_WEIGHT * out.z_loss

    tracker = SettledLiveBytes()
    memory: StepMemory = measure_step(block, loss_fn, optimizer, warmup=0 if case.first_step else 1,
                                      after_backward=lambda: block.reduce_gradients(meshes), tracker=tracker)
    return {"rank": dist.get_rank(), "memory": memory, "counts": seen["counts"], "peak_op": tracker.peak_op,
            "peak_op_bytes": tracker.peak_op_bytes}


def measure_cases(cases: list[MoEStepCase]) -> list[dict]:
    """On a rank: `measure_moe_step` of each case in turn (one launch for cases of one world size)."""
    return [measure_moe_step(case) for case in cases]


def compare(case: MoEStepCase, ranks: list[dict]) -> list[dict]:
    """Each rank's measured step (`measure_moe_step`'s results, one per rank) beside the predicted peak
    (`estimate.moe_step_peak`) for the routing that rank measured."""
    from distlab.memory.estimate.moe_block_activations import BlockShape
    from distlab.memory.estimate.moe_step_peak import predict_moe_step_peak, rank_rows_of

    s = BlockShape(case.batch, case.seq, case.hidden, case.heads, case.ffn, case.experts, case.k, case.tp,
                   case.ep, e=2 if case.dtype == "bfloat16" else 4)
    counts = [r["counts"] for r in ranks]
    out = []
    for r in ranks:
        rows = rank_rows_of(counts, r["rank"], case.tp, case.ep)
        p = predict_moe_step_peak(s, rows, case.adam, case.first_step)
        out.append({"rank": r["rank"], "predicted": p.peak_bytes, "measured": r["memory"].peak_bytes,
                    "phase": p.phase, "measured_phase": r["memory"].peak_phase, "where": p.where,
                    "peak_tensor_bytes": p.peak_tensor[1], "peak_op_bytes": r["peak_op_bytes"],
                    "sum_of_parts": p.sum_of_parts_bytes, "rows": rows})
    return out


def table(grid: dict[int, list[MoEStepCase]] | None = None) -> str:
    """The book's table: for each case its rank with the highest predicted peak (the first
    such rank: arithmetic, so the same rank on every run), predicted beside measured
    (bytes), where the peak falls, and the estimator's sum (model states + all saved activations)."""
    from distlab import launch

    lines = ["| case | rank | predicted (B) | measured (B) | error | peak in | sum of parts |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for world, cases in sorted((GRID if grid is None else grid).items()):
        runs = launch.run(measure_cases, world, cases, timeout=240)
        for i, case in enumerate(cases):
            top = max(compare(case, [r[i] for r in runs]), key=lambda row: row["predicted"])
            error = top["predicted"] / top["measured"] - 1
            over = top["sum_of_parts"] / top["measured"] - 1
            lines.append(f"| {case.label()} | {top['rank']} | {top['predicted']:,} | {top['measured']:,} | "
                         f"{error:+.3%} | {top['phase']}: {top['where']} | {over:+.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
