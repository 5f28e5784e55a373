"""Chapter 7, FP8: one inf or NaN input must not poison the scales of later, finite casts, and is counted.

Delayed scaling keeps the last good scale: a non-finite amax is not entered into the history, so every
later cast scales exactly as if the bad input had never come (compared bit for bit with a layer that
never saw it). Current scaling scales by the finite values' amax, so one inf among 32 values is one
overflow (it saturates), one non-finite input, and no underflow.
"""

from __future__ import annotations

import pytest
import torch

from distlab.memory.fp8.formats import E4M3
from distlab.memory.fp8.linear import Fp8Linear, Fp8Recipe, fp8_stats
from distlab.memory.fp8.scaling import DelayedScaling, quantize


def _layer(history: int) -> Fp8Linear:
    torch.manual_seed(0)
    return Fp8Linear(8, 4, recipe=Fp8Recipe(delayed=DelayedScaling(history=history)))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
@pytest.mark.parametrize("history", [1, 4])
def test_delayed_scaling_keeps_the_last_good_scale_after_a_non_finite_input(bad: float, history: int) -> None:
    torch.manual_seed(1)
    xs = [torch.randn(3, 8) * (1 + t) for t in range(6)]
    poisoned = xs[2].clone()
    poisoned[1, 3] = bad
    seen, clean = _layer(history), _layer(history)
    with torch.no_grad():
        for t, x in enumerate(xs):
            if t == 2:
                seen(poisoned)
            y_seen, y_clean = seen(x), clean(x)
            assert torch.isfinite(y_seen).all(), f"step {t}: the output is not finite after one {bad}"
            assert torch.equal(y_seen, y_clean), f"step {t}: the {bad} changed a later scale"
    stats = fp8_stats(seen)
    assert stats["input"]["nonfinite"] == 1 and stats["weight"]["nonfinite"] == 0


def test_a_non_finite_first_cast_keeps_scale_one_then_recovers() -> None:
    d = DelayedScaling(history=2)
    assert float(d.scale("x", torch.tensor([[float("inf"), 1.0]]), E4M3)) == 1.0  # no good scale yet
    assert list(d.amax_history["x"]) == []  # the inf is not in the history
    assert float(d.scale("x", torch.tensor([[2.0, 1.0]]), E4M3)) == E4M3.max / 2  # a first cast: its amax
    assert float(d.scale("x", torch.tensor([[float("nan"), 1.0]]), E4M3)) == E4M3.max / 2  # the history's
    assert float(d.scale("x", torch.tensor([[4.0, 1.0]]), E4M3)) == E4M3.max / 2


def test_one_inf_under_current_scaling_is_one_overflow_not_31_underflows() -> None:
    x = torch.linspace(0.5, 2.0, 32).view(4, 8)
    x[0, 0] = float("inf")
    q = quantize(x, "e4m3")
    assert (q.overflow, q.underflow, q.nonfinite) == (1, 0, 1)
    finite = x.clone()
    finite[0, 0] = 0.0
    back, want = q.dequantize(), quantize(finite, "e4m3").dequantize()
    assert float(back[0, 0]) == E4M3.max / float(q.scale)  # saturated at the format's max
    assert torch.equal(back.flatten()[1:], want.flatten()[1:])  # the finite values cast as without it
    nan = x.clone()
    nan[0, 0] = float("nan")
    qn = quantize(nan, "e4m3")
    assert (qn.overflow, qn.underflow, qn.nonfinite) == (0, 0, 1) and torch.isnan(qn.dequantize()[0, 0])
