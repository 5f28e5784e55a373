"""The hang finder on synthetic flight records: every randomised planting (which rank, which step, which
collective, which mistake) is named exactly, on 2 to 8 ranks, with records cut where a real hang cuts them."""

from __future__ import annotations

import random

import pytest

from distlab.observe.flight import CollectiveRecord, records_from_dump
from distlab.observe.hang import diagnose
from distlab.observe.plant import STEP, Planting, planted_calls, program, random_planting


def _records(calls: list[tuple[str, int]], upto: int) -> list[CollectiveRecord]:
    return [CollectiveRecord(i + 1, f"gloo:{op}", ((n,),)) for i, (op, n) in enumerate(calls[:upto])]


def _simulate(steps: int, world: int, planting: Planting, rng: random.Random) -> dict[int, list]:
    """Each rank's record as a hang leaves it: every rank stops at or a little after the broken collective
    (a mismatched size can complete on some ranks), the culprit with its own calls."""
    s = planting.seq()
    out = {}
    for r in range(world):
        calls = planted_calls(steps, planting, r)
        out[r] = _records(calls, s + rng.randint(0, 2))
    return out


def _expected_kind(planting: Planting, steps: int) -> str:
    if planting.mistake == "size":
        return "size"
    if planting.mistake == "skip" and planting.seq() == steps * len(STEP):
        return "missing"
    return "order"


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_random_plantings_are_named_exactly(world: int) -> None:
    rng = random.Random(world)
    steps = 4
    for _ in range(300):
        planting = random_planting(rng, world, steps)
        found = diagnose(_simulate(steps, world, planting, rng))
        if world == 2:
            # two ranks that disagree: no majority, so either could be the odd one; the number is still exact
            assert found is not None and found.seq == planting.seq(), planting
            continue
        assert found is not None, planting
        assert (found.seq, found.ranks) == (planting.seq(), (planting.rank,)), planting
        if planting.step == 0 and planting.mistake != "size":
            # in the first step the others have not issued the out-of-place call yet: the records cannot
            # tell a skipped all-reduce from one of another size, so only the rank and the number count
            assert found.kind in ("order", "size", "other"), planting
        else:
            assert found.kind == _expected_kind(planting, steps), planting


def test_agreeing_records_have_no_divergence_and_a_ring_buffer_is_aligned() -> None:
    calls = program(3)
    full = _records(calls, len(calls))
    assert diagnose({0: full, 1: full, 2: full}) is None
    # rank 1 kept only its last 4 entries (a small buffer): the common part still agrees
    assert diagnose({0: full, 1: full[-4:], 2: full}) is None
    late = dict(enumerate([full, full[-4:], full[:-1]]))
    found = diagnose(late)
    assert (found.seq, found.ranks, found.kind) == (len(calls), (2,), "missing")
    assert "rank 2 issued nothing" in found.verdict()


def test_the_verdict_names_rank_collective_and_sequence_number() -> None:
    calls = program(2)
    records = {r: _records(calls, 5) for r in range(4)}
    records[3] = _records(planted_calls(2, Planting(3, 1, 0, "size"), 3), 5)
    found = diagnose(records)
    assert found.verdict() == ("collective #4: rank 3 called all_reduce [7] where the others called "
                               "all_reduce [6] (the same operation with different sizes)")
    records[3] = records[3][:3] + [CollectiveRecord(4, "gloo:all_gather", ((6,),))]
    assert diagnose(records).kind == "other"


def test_a_dump_is_read_by_group_and_bad_input_is_refused() -> None:
    entry = {"collective_seq_id": 2, "profiling_name": "gloo:broadcast", "input_sizes": [[3]],
             "process_group": ["1", ""], "is_p2p": False, "state": "scheduled"}
    dump = {"entries": [entry, {**entry, "collective_seq_id": 1, "profiling_name": "gloo:all_reduce"},
                        {**entry, "process_group": ["0", "default_pg"]}, {**entry, "is_p2p": True}]}
    got = records_from_dump(dump, "1")
    assert [(r.seq, r.describe()) for r in got] == [(1, "all_reduce [3]"), (2, "broadcast [3]")]
    with pytest.raises(ValueError, match="no 'entries'"):
        records_from_dump({"version": "2.10"})
    with pytest.raises(ValueError, match="at least 2 ranks"):
        diagnose({0: got})
    with pytest.raises(ValueError, match="two records with sequence number 2"):
        diagnose({0: got + got[1:], 1: got})
    with pytest.raises(ValueError, match="swaps the last collective"):
        planted_calls(1, Planting(0, 0, 2, "order"), 0)


def test_an_extra_collective_at_the_end_is_named() -> None:
    calls = program(1)
    records = {r: _records(calls, len(calls)) for r in range(3)}
    records[1] = records[1] + [CollectiveRecord(len(calls) + 1, "gloo:all_reduce", ((6,),))]
    found = diagnose(records)
    assert (found.seq, found.ranks, found.kind) == (len(calls) + 1, (1,), "order")
    assert found.verdict().startswith(f"collective #{len(calls) + 1}: rank 1 called all_reduce [6] where the "
                                      "others issued nothing")
