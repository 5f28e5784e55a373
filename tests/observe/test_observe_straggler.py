"""The straggler rule (median + k * 1.4826 * MAD, Leys et al. 2013) on exact numbers, and one slowed rank
among 4 real ranks: found, and the others wait for it."""

from __future__ import annotations

import pytest

from distlab import launch
from distlab.observe.straggler import find_stragglers, outliers, timed_steps


def test_the_rule_on_exact_numbers() -> None:
    # median 11, deviations 1 0 1 19 2 -> MAD 1, scale 1.4826, threshold 11 + 3 * 1.4826 = 15.4478
    threshold, slow = outliers([10.0, 11.0, 12.0, 30.0, 9.0])
    assert threshold == pytest.approx(15.4478) and slow == (3,)
    # all alike: MAD 0, the floor 5 % of the median keeps the rule from naming noise
    assert outliers([1.0, 1.0, 1.0, 1.0]) == (pytest.approx(1.15), ())
    assert outliers([1.0, 1.0, 1.0, 1.2])[1] == (3,)
    assert outliers([1.0, 1.0, 1.0, 1.1])[1] == ()
    with pytest.raises(ValueError, match="values is empty"):
        outliers([])
    with pytest.raises(ValueError, match="k must be > 0"):
        outliers([1.0], k=0)


def test_the_report_says_who_and_how_long_the_others_waited() -> None:
    work = [[0.01, 0.01], [0.06, 0.05], [0.01, 0.012]]
    wait = [[0.05, 0.04], [0.001, 0.001], [0.048, 0.04]]
    report = find_stragglers(work, wait)
    assert report.stragglers == (1,)
    assert report.others_waited() == pytest.approx(0.0445)
    assert report.verdict().startswith("straggler: rank 1 ")
    assert find_stragglers([[1.0], [1.0]], [[0.0], [0.0]]).others_waited() == 0.0
    with pytest.raises(ValueError, match="work has 2 ranks and wait 1"):
        find_stragglers([[1.0], [1.0]], [[0.0]])


def test_a_slowed_rank_among_four_is_found() -> None:
    delay = 0.05
    out = launch.run(timed_steps, 4, 6, delay, 2, timeout=60)
    report = find_stragglers([w for w, _ in out], [t for _, t in out])
    assert report.stragglers == (2,)
    assert report.others_waited() > 0.5 * delay  # they wait for most of its delay
    assert report.wait[2] < min(w for r, w in enumerate(report.wait) if r != 2)
