"""The peak of one training step of chapter 6's folded MoE block on one rank, predicted tensor by tensor.

The estimator's sum, model states (`moe_states`) plus every saved activation (`moe_block_activations`),
overshoots the peak of a step, because no moment holds all of it: the gradients do not exist during
forward (`zero_grad(set_to_none=True)` freed them), and in backward each node frees its saved tensors as
its weight gradients appear (Chen et al. 2016, sec. 3; `peak.py` says the same for the dense GPT). On the
other side a step holds tensors in neither sum: the output and its gradient, the all-to-alls' buffers, the
combine's out-of-place copies, the clones f and g all-reduce, the top-k's one-hot matrix (`moe_step_ops`).

`predict_moe_step_peak` replays the step on a `timeline.Timeline`: the parameters (and Adam's state, in a
later step; Adam makes it lazily inside the first step: `torch.optim.Adam._init_group`), the forward and
the loss (`moe_step_ops.forward`), the backward in autograd's order (`moe_step_backward`), then Adam in the
implementation that runs (`optimizer_step.adam_step`: its for-loop, foreach or fused scratch). Its maximum
is the peak, with its phase, the op it falls on and the bytes alive by kind. The routing is an input
(`RankRows`, e.g. from the counts the router measured: `rank_rows_of`); nothing is fitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distlab.memory.estimate.moe_block_activations import BlockShape, block_saved_bytes, rank_rows
from distlab.memory.estimate.moe_step_backward import backward
from distlab.memory.estimate.moe_step_ops import RankRows, Widths, forward
from distlab.memory.estimate.optimizer_step import FORMS, adam_step
from distlab.memory.estimate.timeline import Timeline

STEP_BYTES = 4  # Adam's step counter: one fp32 scalar tensor per parameter (torch 2.13, on the CPU)


@dataclass(frozen=True)
class MoEStepPeak:
    """The predicted peak of one step on one rank, where it falls and what is alive at it, beside the
    estimator's sum (model states + all saved activations)."""

    peak_bytes: int
    phase: str
    where: str
    parts: dict[str, int]
    sum_of_parts_bytes: float
    timeline: Timeline

    @property
    def peak_tensor(self) -> tuple[str, int]:
        """The tensor whose allocation made the peak, and its bytes."""
        name = list(self.timeline.peak_alive)[-1]
        return name, self.timeline.peak_alive[name][1]


def block_parameter_sizes(s: BlockShape) -> list[int]:
    """Elements of each parameter tensor of one rank's `FoldedMoEBlock`, in `parameters()` order (the order
    Adam visits them): ln_1, attention's c_attn and c_proj shards (weights and biases), ln_2, the router,
    then each local expert's w_in and w_out (weights and biases)."""
    h, tp, f = s.hidden, s.tp, s.ffn
    dense = [h, h, 3 * h // tp * h, 3 * h // tp, h * h // tp, h, h, h, s.experts * h]
    return dense + [f * h, f, h * f, h] * (s.experts // s.ep)


def rank_rows_of(counts: Sequence[Sequence[int]], rank: int, tp: int, ep: int) -> RankRows:
    """The routing of global rank `rank` of a folded layout, from every rank's kept assignments per expert
    (`counts[r]`, E numbers, as `Routing.tokens_per_expert()` gives them), in global rank order."""
    group = [c for r, c in enumerate(counts) if r // ep == rank // ep]
    sent, received = rank_rows(group, rank % ep)
    return RankRows(rank % tp, sent, tuple(received))


def _check(s: BlockShape, rows: RankRows, adam: str) -> None:
    if adam not in FORMS:
        raise ValueError(f"adam={adam!r} is unknown; choose one of {', '.join(FORMS)}")
    if len(rows.received) != s.experts // s.ep:
        raise ValueError(f"rows.received has {len(rows.received)} counts but the rank holds "
                         f"experts/ep = {s.experts // s.ep} experts; give one count per local expert")
    if not 0 <= rows.tp_rank < s.tp:
        raise ValueError(f"rows.tp_rank={rows.tp_rank} is outside the tp group of {s.tp}; "
                         f"use 0 .. {s.tp - 1}")


def predict_moe_step_peak(s: BlockShape, rows: RankRows, adam: str = "for-loop",
                          first_step: bool = False) -> MoEStepPeak:
    """The peak of one step (forward, loss, backward, `reduce_gradients`, Adam) of `FoldedMoEBlock` on one
    rank of shape `s` that routed `rows`; `adam` is the implementation that runs (`optimizer_step.FORMS`);
    `first_step`: Adam's state does not exist yet and is made inside the step."""
    _check(s, rows, adam)
    sizes = block_parameter_sizes(s)
    params = s.e * sum(sizes)
    state = 2 * s.e * sum(sizes) + STEP_BYTES * len(sizes)  # exp_avg, exp_avg_sq in the parameters' dtype
    tl = Timeline()
    tl.alloc("params", params, "params")
    if not first_step:
        tl.alloc("optimizer state", state, "optimizer")
    forward(tl, s, rows)
    backward(tl, Widths(s, rows))
    tl.phase = "optimizer"
    if first_step:
        tl.where = "Adam's state, made lazily"
        tl.alloc("optimizer state", state, "optimizer")
    adam_step(tl, sizes, adam, s.e)
    saved = block_saved_bytes(s, rows.sent, rows.received, rows.tp_rank)
    return MoEStepPeak(tl.peak, tl.peak_phase, tl.peak_where, tl.parts(), params * 2 + state + saved, tl)
