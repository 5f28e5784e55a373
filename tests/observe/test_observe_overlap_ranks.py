"""Overlap measured from real 2-rank traces of chapter 2's strategies: the trace, `comm_log` and chapter 2's
`StepTimeline` count the same all-reduces; the trace's communication lies inside the timeline's and,
inside the backward passes, it hides at most the timeline's hidden seconds; the overlapped strategy
hides more than the blocking ones, which hide none; `no_sync` accumulation over 4 micro-batches
all-reduces once per step; and the merged trace has one process per rank."""

from __future__ import annotations

import json

from distlab.observe.measured import VARIANTS, checks, measure_overlap


def test_overlap_from_traces_agrees_with_chapter_2(tmp_path) -> None:
    rows, merged = measure_overlap(tmp_path, world_size=2, steps=2)
    by = {(r.strategy, r.accumulate, r.trace.rank): r for r in rows}
    for row in rows:
        assert checks(row) == {"counts": True, "inside": True, "hidden": True}, row
    for rank in (0, 1):
        assert by[("overlapped", 1, rank)].timeline_hidden_fraction > 0
        for blocking in ("per_parameter", "bucketed"):
            assert by[(blocking, 1, rank)].trace.hidden_fraction < 0.05
        per_param, bucketed = by[("per_parameter", 1, rank)], by[("bucketed", 1, rank)]
        assert per_param.comm_log_calls > bucketed.comm_log_calls  # one message per tensor
        assert by[("overlapped", 4, rank)].comm_log_calls == by[("overlapped", 1, rank)].comm_log_calls
    # the rank whose backward ends first waits for the other: at least one rank hides a tenth
    assert max(by[("overlapped", 1, rank)].timeline_hidden_fraction for rank in (0, 1)) > 0.1
    assert len(merged) == len(VARIANTS)
    pids = {e["pid"] for e in json.loads(merged[0].read_text())["traceEvents"]}
    assert pids == {0, 1}
