"""The peak of a training step: which phase it falls in, and which tensors are alive at that moment.

The estimator (`estimator.py`) adds model states and activations, and each of those parts is exact. The
peak is not their sum. No tensor lives through the whole step: the gradients do not exist during
forward (`zero_grad(set_to_none=True)` freed them) and appear one layer at a time during backward, while
each layer's saved activations are freed as soon as its backward has used them; backward also holds
tensors that are in neither part (the gradient of the residual stream, the 4h-wide gradients of the MLP),
and under recomputation it rebuilds a layer's working set before it can go backward through it (Chen et
al. 2016, sec. 3; Korthikanti et al. 2022, sec. 5). The optimizer's step then holds every gradient with
its own scratch space, and mixed precision adds fp32 copies of the gradients for the master weights
(Micikevicius et al. 2018).

`predict_peak(config)` follows one step of `distlab.models.GPT` as PyTorch runs it on CPU, tensor by tensor:
every op's output is allocated when the op runs and freed when its last user is done (the forward's
saved tensors at their backward, a temporary at the next op), in the order autograd runs the backward
(`timeline.Timeline` keeps the running total; `gpt_step` holds the ops and their tensors). Its maximum
is the peak, split into the same kinds `accounting.measure_step` measures: parameters, gradients,
optimizer state, saved activations, and temporaries (the recomputed working set among them, shown apart
here). Nothing is fitted: every size comes from the shape and the dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.memory.estimate import cost_model, estimator
from distlab.memory.estimate.estimator import MemoryConfig
from distlab.memory.estimate.gpt_ends import backward, forward, gpt_parameter_sizes
from distlab.memory.estimate.gpt_step import StepShape
from distlab.memory.estimate.optimizer_step import adam_form, adam_step, master_step
from distlab.memory.estimate.timeline import KINDS, Timeline

__all__ = ["KINDS", "PeakPrediction", "Timeline", "check_peak_config", "gpt_parameter_sizes", "predict_peak"]


@dataclass(frozen=True)
class PeakPrediction:
    """The predicted peak of one training step and what is alive at it."""

    peak_bytes: int
    phase: str  # forward, backward or optimizer
    where: str  # the op the peak falls on
    parts: dict[str, int]  # bytes alive at the peak by kind (KINDS)
    sum_of_parts_bytes: float  # the estimator's total: model states + activations

    def to_dict(self) -> dict[str, object]:
        return {
            "predicted_peak_bytes": self.peak_bytes,
            "predicted_peak_phase": self.phase,
            "predicted_peak_where": self.where,
            **{f"predicted_peak_{k}_bytes": v for k, v in self.parts.items()},
            "estimator_total_bytes": self.sum_of_parts_bytes,
        }


def check_peak_config(c: MemoryConfig) -> None:
    """The peak model follows the course's GPT on CPU, one process, the whole model: say what is not."""
    if not estimator.validate(c):
        raise ValueError("the peak needs the model's shape: give layers, hidden, heads and vocab")
    checks = {
        "tp": (c.tp, 1),
        "pp": (c.pp, 1),
        "cp": (c.cp, 1),
        "offload": (c.offload, False),
        "sequence_parallel": (c.sequence_parallel, False),
        "attention": (c.attention, "flash"),
        "dropout": (c.dropout, False),
        "params": (c.params, None),
    }
    for name, (value, want) in checks.items():
        if value != want:
            raise ValueError(
                f"{name}={value!r}: the peak model follows the course's GPT step in one process "
                f"(flash attention, no dropout, the whole model); set {name}={want!r}"
            )


def predict_peak(c: MemoryConfig, plan: list[str] | None = None, bias: bool = True) -> PeakPrediction:
    """The peak of one training step of `distlab.models.GPT` (micro-batch `c.micro_batch` of `c.seq`
    tokens) with Adam in the implementation `c.adam` runs on `c.device` (`optimizer_step`): fp32
    (`precision="fp32"`) or a bf16 model with fp32 master weights (`precision="mixed"`,
    `precision.MasterWeights`). `plan` is a per-layer recomputation plan
    (`recompute.LAYER_OPTIONS`); by default the one of `c.recompute`."""
    from distlab.memory.techniques.recompute import (  # recompute imports models (torch)
        check_plan,
        policy_plan,
    )

    check_peak_config(c)
    plan = check_plan(plan, c.layers) if plan is not None else policy_plan(c.recompute, c.layers)
    if set(plan) - {"none", "core", "block"}:
        raise ValueError(
            f"plan={plan}: the peak model knows the options none, core (selective) and block (full); "
            "recomputing the MLP alone ('mlp', 'core+mlp') is not modelled yet"
        )
    e = 4 if c.precision == "fp32" else 2
    sh = StepShape(c.micro_batch * c.seq, c.seq, c.hidden, c.heads, c.vocab, e, bias)
    sizes = gpt_parameter_sizes(c.layers, c.hidden, c.vocab, c.seq, bias)
    weights, _, state = cost_model.model_state_bytes(sum(sizes), c.precision)  # the estimator's parts
    form = adam_form(c.adam, c.device)
    tl = Timeline()
    tl.alloc("params", weights, "params")
    tl.alloc("optimizer state", state + 4 * len(sizes), "optimizer")  # + Adam's fp32 step per tensor
    forward(tl, sh, plan)
    backward(tl, sh, plan)
    tl.phase = "optimizer"
    if c.precision == "fp32":
        adam_step(tl, sizes, form, 4)
    else:
        master_step(tl, sizes, form)
    total = estimator.estimate(c).total_bytes
    return PeakPrediction(tl.peak, tl.peak_phase, tl.peak_where, tl.parts(), total)
