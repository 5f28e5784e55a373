"""Chapter 12: a small world with values. The same step on 4 real ranks equals one process (float64), and
the dry run of the same layout records, rank by rank, the same calls and bytes as the real ranks sent."""

from __future__ import annotations

import pytest

from distlab.dryrun.parity import small_layout, small_world_check


def test_real_ranks_equal_one_process_and_the_dry_run_equals_the_real_run() -> None:
    layout = small_layout(dp=2, pp=2, tp=1, zero_stage=1, m=2, layers=3)  # uneven: 2 + 1 blocks
    world = small_world_check(layout)
    assert world.passed, world.verdict()
    assert world.same_traffic == [True] * 4
    assert "agree with one process within 1e-10: ok" in world.verdict()


def test_a_world_too_large_for_processes_is_refused() -> None:
    with pytest.raises(ValueError, match=r"has 16 ranks; a world with values starts one process per rank"):
        small_world_check(small_layout(dp=4, pp=2, tp=2))
