"""Overlap from traces: the interval arithmetic exact on synthetic spans, and a synthetic Chrome trace read
the way torch.profiler writes one on a gloo rank (ops on the main thread, gloo ranges on a worker)."""

from __future__ import annotations

import pytest

from distlab.observe import intervals
from distlab.observe.measured import _row, checks
from distlab.observe.overlap import overlap
from distlab.observe.trace import BACKWARD_LABEL, STEP_LABEL, Span, merge, spans


def test_interval_arithmetic_is_exact() -> None:
    assert intervals.union([(3, 4), (0, 1), (1, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert intervals.intersection([(0, 4), (6, 9)], [(1, 2), (3, 7), (8, 10)]) == [(1, 2), (3, 4), (6, 7),
                                                                                   (8, 9)]
    assert intervals.difference([(0, 10)], [(1, 2), (4, 6), (9, 12)]) == [(0, 1), (2, 4), (6, 9)]
    assert intervals.difference([(0, 1)], []) == [(0, 1)]
    assert intervals.length([(0, 3), (2, 5), (7, 8)]) == 6
    assert intervals.clip([(0, 3), (4, 9)], (2, 5)) == [(2, 3), (4, 5)]
    with pytest.raises(ValueError, match=r"interval \(2, 1\) ends before it starts"):
        intervals.union([(2, 1)])


def _span(kind: str, a: float, b: float, row: str = "main") -> Span:
    return Span(0, row, kind, a, b, kind)


def test_hidden_exposed_and_idle_on_a_synthetic_step() -> None:
    # step [0, 10): compute [0, 6) and [7, 8); communication [4, 9) on a worker thread
    s = [_span("step", 0, 10), _span("compute", 0, 6), _span("compute", 7, 8),
         _span("comm", 4, 9, "thread 1")]
    o = overlap(s)
    assert (o.window, o.compute, o.comm, o.hidden, o.exposed, o.idle) == (10, 7, 5, 3, 2, 1)
    assert o.hidden_fraction == pytest.approx(0.6) and o.comm_spans == 1
    # communication outside the step windows does not count
    o2 = overlap(s + [_span("comm", 20, 30, "thread 1")])
    assert (o2.comm, o2.comm_spans) == (5, 1)
    with pytest.raises(ValueError, match="pass one rank's spans"):
        overlap(s + [Span(1, "main", "x", 0, 1, "compute")])
    with pytest.raises(ValueError, match="no spans"):
        overlap([])


def _x(name: str, cat: str, tid: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "pid": 99, "tid": tid, "ts": ts, "dur": dur}


def test_a_gloo_rank_trace_is_read_and_merged() -> None:
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 99, "tid": 0, "args": {"name": "python"}},
        _x(STEP_LABEL, "user_annotation", 1, 0, 1000),
        _x("aten::mm", "cpu_op", 1, 0, 400), _x("aten::add", "cpu_op", 1, 100, 50),
        _x("c10d::allreduce_", "cpu_op", 1, 400, 10), _x("PythonDispatchMode", "cpu_op", 1, 400, 500),
        _x("aten::div_", "cpu_op", 1, 900, 100),
        _x("gloo:all_reduce", "user_annotation", 7, 420, 460)]}
    got = spans(trace, 3)
    assert {(s.row, s.kind) for s in got} == {("main", "step"), ("main", "compute"), ("thread 1", "comm")}
    o = overlap(got)
    assert o.compute == pytest.approx(5e-4) and o.comm == pytest.approx(4.6e-4)
    assert o.hidden == 0 and o.exposed == pytest.approx(4.6e-4) and o.idle == pytest.approx(4e-5)
    merged = merge({0: trace, 1: trace})
    names = [e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"]
    assert names == ["rank 0", "rank 1"]
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    with pytest.raises(ValueError, match="no complete"):
        spans({"traceEvents": []}, 0)


class _Timeline:
    """The parts of chapter 2's StepTimeline that `measured._row` reads: one all-reduce, launched at
    3 ms of a 5 ms backward and done at 9 ms (times from backward's start)."""

    nbytes, launch, done = (1024,), (3e-3,), (9e-3,)
    comm_seconds, hidden_seconds, exposed_seconds, backward_end = 6e-3, 2e-3, 4e-3, 5e-3


def _overlapped_step(comm_start_us: float) -> list[Span]:
    """One traced step: backward [0, 5000) us, then a bucket copied back [6000, 9000) us on the main
    thread; the gloo all-reduce from `comm_start_us` to 8800 us on a worker thread."""
    trace = {"traceEvents": [
        _x(STEP_LABEL, "user_annotation", 1, 0, 10000),
        _x(BACKWARD_LABEL, "user_annotation", 1, 0, 5000),
        _x("aten::mm", "cpu_op", 1, 0, 5000), _x("aten::copy_", "cpu_op", 1, 6000, 3000),
        _x("gloo:all_reduce", "user_annotation", 7, comm_start_us, 8800 - comm_start_us)]}
    return spans(trace, 0)


def test_hidden_is_compared_inside_backward_not_over_the_step() -> None:
    got = _overlapped_step(comm_start_us=4000)
    assert {(s.row, s.kind) for s in got} == {("main", "step"), ("main", "backward"), ("main", "compute"),
                                             ("thread 1", "comm")}
    out = {"timelines": [_Timeline()], "calls": 1}
    row = _row("overlapped", 1, out, got)
    # over the whole step the trace hides 1 ms in backward and 2.8 ms behind the copy: 79 % of its
    # 4.8 ms, above the timeline's 33 %; inside backward, 1 ms, below the timeline's 2 ms
    assert row.trace.hidden_fraction == pytest.approx(3.8 / 4.8)
    assert row.trace.hidden_fraction > row.timeline_hidden_fraction + 0.05
    assert row.trace_hidden_in_backward == pytest.approx(1e-3)
    assert checks(row) == {"counts": True, "inside": True, "hidden": True}
    # a trace that hides more inside backward than the timeline saw in flight there is caught
    early = _row("overlapped", 1, out, _overlapped_step(comm_start_us=0))
    assert early.trace_hidden_in_backward == pytest.approx(5e-3)
    assert checks(early)["hidden"] is False


def test_the_trace_figure_draws_a_row_per_rank_and_thread() -> None:
    from distlab.observe.figures import trace_figure

    by_rank = {r: [Span(r, "main", "aten::mm", 0.0, 0.002, "compute"),
                   Span(r, "thread 1", "gloo:all_reduce", 0.001, 0.003, "comm")] for r in (0, 1)}
    fig = trace_figure(by_rank, "no step ranges: one window per rank")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["rank 1 thread 1", "rank 1 main", "rank 0 thread 1", "rank 0 main"]
    with pytest.raises(ValueError, match="at least 2 step range"):
        trace_figure(by_rank, "", step=1)
