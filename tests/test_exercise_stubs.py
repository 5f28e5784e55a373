"""An exercise check given the student version's stub (a function that raises NotImplementedError)
reports each case as "not written yet", in its table, instead of a bare traceback: in every chapter, for
checks that call the function here and for checks that run it inside ranks (where the stub comes back as
a `launch.RankError`). A check that starts ranks launches once: after the stub, it starts no more."""

from __future__ import annotations

import pytest

from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult, is_stub, not_written
from distlab.launch import RankError

STUB_MESSAGE = "Your turn: write this part (see the instructions above)"  # distlab.student.STUB's


def _stub(*args: object) -> object:
    raise NotImplementedError(STUB_MESSAGE)


def _all_not_written(result: CheckResult) -> None:
    assert isinstance(result, CheckResult) and not result.passed and result.cases, str(result)
    assert all(case.lines == [NOT_WRITTEN] for case in result.cases), str(result)
    assert f"{NOT_WRITTEN}" in str(result) and NOT_WRITTEN in result._repr_html_()


def test_is_stub_recognises_the_stub_here_and_inside_ranks() -> None:
    assert is_stub(NotImplementedError(STUB_MESSAGE))
    tb = ('Traceback (most recent call last):\n  File "<cell 28>", line 9\n'
          f'NotImplementedError: {STUB_MESSAGE}\n')
    assert is_stub(RankError("rank 0 failed with NotImplementedError", 0, tb))
    assert not is_stub(RankError("rank 1 timed out", 1, "Traceback ...\nRuntimeError: timed out\n"))
    assert not is_stub(RankError("rank 1 died", 1))
    assert not is_stub(ValueError("NotImplementedError in the message is not the stub"))
    assert not_written("2 ranks") == CaseResult("2 ranks", False, [NOT_WRITTEN])


def test_in_process_checks_report_the_stub() -> None:
    """Chapters 3, 4, 6, 7, 9 and 10: the check calls the function in this process."""
    from distlab.async_sgd.exercises import check_may_start
    from distlab.context_parallel.exercises import check_merge, check_zigzag_chunks
    from distlab.memory.exercises import check_loss_scale_update, check_sqrt_segments
    from distlab.moe.exercises import check_dispatch_combine, check_top_k_gating
    from distlab.parallel3d.checkpoint.exercises import check_steps_lost
    from distlab.parallel3d.exercises import check_coordinates, check_placement
    from distlab.pipeline.exercises import check_one_f_one_b, check_zb_h1_rank
    from distlab.plan.exercises import check_dp_term

    for check in (check_may_start, check_zb_h1_rank, check_top_k_gating, check_dispatch_combine,
                  check_loss_scale_update, check_sqrt_segments, check_coordinates, check_placement,
                  check_steps_lost, check_dp_term, check_merge, check_zigzag_chunks):
        _all_not_written(check(_stub))
    _all_not_written(check_one_f_one_b(_stub, run=False))
    _all_not_written(check_one_f_one_b(_stub))  # the real-ranks part runs only once the order is right


def test_collectives_checks_report_the_stub_after_one_launch() -> None:
    """Chapter 1: one rank raises, the check says so for every world size, and launches no more."""
    from distlab.collectives.exercises import check_ring_all_reduce, check_two_level_all_reduce

    ring = check_ring_all_reduce(_stub, progress=False)
    _all_not_written(ring)
    assert [c.label for c in ring.cases] == ["1 rank", "2 ranks", "3 ranks", "4 ranks"]
    _all_not_written(check_two_level_all_reduce(_stub, layouts=((1, 1), (2, 2)), progress=False))


@pytest.mark.parametrize("chapter", ["data_parallel", "tensor_parallel", "moe", "zero"])
def test_checks_that_run_the_stub_in_ranks_report_it(chapter: str) -> None:
    """Chapters 2, 5, 6 and 7's ZeRO exercise: one small launch each."""
    if chapter == "data_parallel":
        from distlab.data_parallel.exercises import check_bucketed_all_reduce

        _all_not_written(check_bucketed_all_reduce(_stub, world_sizes=(2, 3)))
    elif chapter == "tensor_parallel":
        from distlab.tensor_parallel.exercises import check_tensor_parallel

        result = check_tensor_parallel(_stub, _stub, _stub, _stub, world_sizes=(2, 3))
        assert not result and len(result.cases) == 2, str(result)
        for case in result.cases:  # four pieces, each named once, none with a traceback
            assert case.lines == [f"{name}: {NOT_WRITTEN}" for name in ("shard", "g", "f", "row_linear")]
    elif chapter == "moe":
        from distlab.moe.exercises import check_expert_parallel

        _all_not_written(check_expert_parallel(_stub, world_sizes=(2, 4)))
    else:
        from distlab.memory.zero_exercises import check_zero2_hook

        _all_not_written(check_zero2_hook(_stub))
