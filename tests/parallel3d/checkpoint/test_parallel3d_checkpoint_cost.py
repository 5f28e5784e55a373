"""Chapter 9, part 5, without ranks: the checkpoint-interval formulas (Young 1974, Daly 2006), steps lost,
the lab's exercise check, verdict and figure."""

from __future__ import annotations

import math

import pytest
from matplotlib.figure import Figure

from distlab.parallel3d.checkpoint import cost_model as cost
from distlab.parallel3d.checkpoint.exercises import check_steps_lost
from distlab.parallel3d.checkpoint.figures import resume_figure
from distlab.parallel3d.checkpoint.parity import verdict


def test_young_and_daly():
    assert cost.young_interval(1.0, 180.0) == pytest.approx(math.sqrt(360.0))
    # Daly: the same to first order, a little shorter when delta is not small next to M
    assert cost.daly_interval(1e-6, 1e3) == pytest.approx(cost.young_interval(1e-6, 1e3), rel=1e-3)
    x = 1.0 / 360.0
    want = math.sqrt(360.0) * (1 + math.sqrt(x) / 3 + x / 9) - 1
    assert cost.daly_interval(1.0, 180.0) == pytest.approx(want)
    assert cost.daly_interval(1.0, 180.0) < cost.young_interval(1.0, 180.0)
    assert cost.daly_interval(5.0, 2.0) == 2.0  # delta >= 2M: checkpoint once per MTBF
    assert cost.cluster_mtbf(50_000.0, 16_384) == pytest.approx(50_000.0 / 16_384)


def test_the_waste_at_youngs_interval_is_minimal():
    delta, m = 1.0, 186.0
    waste = [delta / t + t / (2 * m) for t in (10.0, cost.young_interval(delta, m), 40.0)]
    assert waste[1] < waste[0] and waste[1] < waste[2]
    assert waste[1] == pytest.approx(math.sqrt(2 * delta / m))


def test_steps_lost():
    assert [cost.steps_lost(s, 3) for s in range(8)] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert cost.steps_lost(5, 1) == 0


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: cost.young_interval(0, 10), "delta=0 must be a positive number"),
    (lambda: cost.daly_interval(1, float("inf")), "mtbf=inf must be a positive number"),
    (lambda: cost.steps_lost(5, 0), "every=0 must be a positive number of steps"),
    (lambda: cost.steps_lost(-1, 3), "kill_at=-1 must be a step number"),
    (lambda: cost.cluster_mtbf(10, 0), "n_gpus=0 must be a positive integer"),
])
def test_bad_inputs(call, needle):
    with pytest.raises(ValueError) as err:
        call()
    assert needle in str(err.value)


def test_exercise_check_passes_the_solution_and_explains_a_wrong_one():
    assert check_steps_lost(lambda s, k: s % k)
    wrong = check_steps_lost(lambda s, k: k)
    assert not wrong
    assert "fn(5, 3) returned 3; the last checkpoint was after step 3, so 2 steps are redone" in str(wrong)


def test_verdict_and_figure():
    lines = verdict({"good": {0: 2.773840499769852}, "bad": {0: 2.7}})
    assert lines == ["good, steps 0-0: losses (0) agree with one process within 1e-10: ok",
                     "bad, steps 0-0: losses (0) agree with one process within 1e-10: FAILED for losses[0]"]
    assert verdict({"resumed": {3: 2.773840499769852 + 1e-3, 4: 2.7}})[0].endswith("FAILED for losses[3], "
                                                                                   "losses[4]")
    fig = resume_figure({0: 1.0, 1: 0.9, 2: 0.8}, {"resumed": {1: 0.9, 2: 0.8}}, saved_at=1)
    assert isinstance(fig, Figure) and fig.axes[0].get_xlabel() == "step"
