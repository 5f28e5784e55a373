"""What the closed forms say one rank of a layout sends and holds: chapter 9's traffic and chapter 7's memory.

Nothing here runs: `predicted(layout, rank)` asks chapter 9's `parallel3d.cost_model.predicted_traffic`
(the bytes per mesh axis and kind of call, from the shapes; Narayanan et al. 2021, Shoeybi et al. 2019,
Rajbhandari et al. 2020) and chapter 7's `memory.estimator.estimate` (parameters, gradients, Adam's state
and the saved activations of the first pipeline stage; Korthikanti et al. 2022) for the same layout, and
`agreement` sets a dry run's measurements beside them as relative differences.

Chapter 7's estimator gives the model states of the pipeline stage that holds the most parameters, the
first (the embedding, and the extra block of an uneven split), and the saved activations of every stage
(`stage_activations`: min(m, p - s) micro-batches in flight on stage s under 1F1B, the head's on the
last). Memory is compared on the first stage's ranks; the traffic on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.dryrun.layouts import DryLayout, estimator_config
from distlab.memory.estimate.estimator import MemoryEstimate, estimate, stage_activations
from distlab.parallel3d.cost_model import Traffic, predicted_traffic

__all__ = ["Agreement", "Prediction", "agreement", "predicted", "relative"]

MEMORY_KINDS = ("params", "grads", "optimizer", "activations")


@dataclass(frozen=True)
class Prediction:
    """Chapter 9's traffic for the rank's stage; chapter 7's model states for the layout (`estimate`: the
    stage that holds the most, the first) and its saved activations for the rank's stage."""

    traffic: Traffic
    memory: MemoryEstimate
    stage_activations: float

    def memory_bytes(self) -> dict[str, float]:
        m = self.memory
        return {"params": m.params_bytes, "grads": m.grads_bytes, "optimizer": m.optimizer_bytes,
                "activations": self.stage_activations}


def predicted(layout: DryLayout, rank: int, dtype_bytes: int = 4, attention: str = "flash") -> Prediction:
    """The closed forms for rank `rank` of `layout` (float32: 4 bytes per element), with attention's
    saved tensors as the dry run ran it ("flash" or "math", `dryrun.attention`)."""
    stage = layout.coords(rank)["pp"]
    traffic = predicted_traffic(layout.config, layout.plan, layout.batch, layout.seq, stage, dtype_bytes)
    c = estimator_config(layout, attention)
    return Prediction(traffic, estimate(c), stage_activations(c)[stage][1])


def relative(measured: float, model: float) -> float:
    """|measured - model| / model (0 when both are 0; infinite when only the model is 0)."""
    if model == 0:
        return 0.0 if measured == 0 else float("inf")
    return abs(measured - model) / model


@dataclass(frozen=True)
class Agreement:
    """Per (axis, kind): (measured sent bytes, predicted, relative difference); per memory kind the same."""

    traffic: dict[tuple[str, str], tuple[float, float, float]]
    memory: dict[str, tuple[float, float, float]]

    def worst(self) -> float:
        return max([d for *_, d in self.traffic.values()] + [d for *_, d in self.memory.values()])

    def within(self, tol: float) -> bool:
        return self.worst() <= tol


def agreement(traffic: Traffic, memory: dict[str, float], prediction: Prediction,
              compare_memory: bool = True) -> Agreement:
    """The measured traffic (chapter 9's `Transfer`s) and memory (bytes by kind) beside `prediction`;
    `compare_memory=False` for a rank off the first stage, which the estimator does not describe."""
    keys = sorted(set(traffic) | set(prediction.traffic))
    t = {}
    for k in keys:
        got = traffic[k].sent_bytes if k in traffic else 0.0
        want = prediction.traffic[k].sent_bytes if k in prediction.traffic else 0.0
        t[k] = (got, want, relative(got, want))
    m = {}
    if compare_memory:
        want_m = prediction.memory_bytes()
        m = {k: (memory[k], want_m[k], relative(memory[k], want_m[k])) for k in MEMORY_KINDS}
    return Agreement(t, m)
