"""Planted hangs on 4 real gloo ranks: the flight recorder's records, read in each rank after its
collective timed out, name the planted rank and sequence number, and the cell finishes in seconds."""

from __future__ import annotations

import random
import time

from distlab import launch
from distlab.observe.flight import BUFFER_VAR
from distlab.observe.hang import diagnose
from distlab.observe.plant import random_planting, run_planted


def test_planted_hangs_on_four_ranks_are_named(monkeypatch) -> None:
    monkeypatch.setenv(BUFFER_VAR, "200")
    rng = random.Random(13)
    plantings = [random_planting(rng, 4, 3) for _ in range(3)] + [None]
    for planting in plantings:
        start = time.monotonic()
        out = launch.run(run_planted, 4, 3, planting, 1.0, timeout=15)
        found = diagnose({r: records for r, (_, records) in enumerate(out)})
        assert time.monotonic() - start < 60
        if planting is None:
            assert found is None and all(outcome == "ok" for outcome, _ in out)
            continue
        assert found is not None, planting
        assert (found.seq, found.ranks) == (planting.seq(), (planting.rank,)), (planting, found)
        assert any(outcome != "ok" for outcome, _ in out), "a planted mistake must stop some rank"
