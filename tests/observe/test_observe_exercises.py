"""The check of lab 13's exercise passes the worked solution (the chapter's `diagnose`), reports a stub as
not written, and names what a typical mistake gets wrong."""

from __future__ import annotations

from distlab.observe.exercises import check_find_hang
from distlab.observe.hang import diagnose


def _solution(records):
    found = diagnose(records)
    return found.seq, found.ranks[0]


def test_the_solution_passes_and_mistakes_are_named() -> None:
    assert check_find_hang(_solution).passed

    def stub(records):
        raise NotImplementedError

    assert check_find_hang(stub).not_written

    def last_to_stop(records):  # a common wrong guess: the rank with the fewest records
        rank = min(records, key=lambda r: len(records[r]))
        return len(records[rank]), rank

    result = check_find_hang(last_to_stop)
    assert not result.passed
    assert "align the ranks' records by sequence number" in str(result)


def test_two_ranks_are_refused_as_a_case_of_the_check() -> None:
    import pytest

    from distlab.observe.exercises import check_find_hang

    with pytest.raises(ValueError, match="worlds=.*at least 3"):
        check_find_hang(lambda records: (1, 0), worlds=(2, 4))
