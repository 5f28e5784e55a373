"""Parity: a pipelined step must compute the same step as one process, to float32 rounding.

`merge` puts the ranks' pieces of one step together (each rank returns its own stages' gradients and
updated weights, the last stage the loss); `step_parity` sets them against the single-process reference
(`train.reference_step`, `gpt.gpt_reference_step`, both `distlab.reference.train_reference`) with
`distlab.parity.compare`, and its `verdict()` is the line a lab prints.

The tolerance is float32's in `distlab.parity.TOLERANCE`, 1e-5: a pipeline sums each parameter's
gradient over m microbatches instead of over the whole batch at once, which only re-associates a float32
sum of terms of size ~1 (each addition's relative error is 2^-24, about 6e-8); the differences seen are
~1e-8, and the loss (a GPT's is ~ln(vocabulary), about 3) differs by a few 1e-7.
"""

from __future__ import annotations

from collections.abc import Sequence

from distlab.parity import ParityReport, compare
from distlab.pipeline.train import Outcome, StepResult


def merge(results: Sequence[StepResult]) -> Outcome:
    """The ranks' results of one step (one per rank of the pipeline) as one `Outcome`."""
    grads: dict = {}
    params: dict = {}
    losses: dict[int, float] = {}
    for r in results:
        grads.update(r.grads)
        params.update(r.params)
        losses.update(r.run.losses)
    if not losses:
        raise ValueError("no result holds the loss: pass the results of every rank, the last stage's "
                         "included")
    return Outcome(sum(losses[k] for k in sorted(losses)) / len(losses), grads, params)


def step_parity(outcome: Outcome, reference: Outcome, label: str = "") -> ParityReport:
    """A pipelined step beside the single-process one (or any two steps beside each other): the loss,
    every gradient and every updated weight, within float32's tolerance. Names must match: merge the
    results of every rank."""
    def parts(o: Outcome) -> dict:
        return {"loss": o.loss, "gradients": o.grads, "updated weights": o.params}

    dtype = next(iter(reference.grads.values())).dtype if reference.grads else None
    return compare(parts(outcome), parts(reference), dtype=dtype, label=label, against="the reference")
