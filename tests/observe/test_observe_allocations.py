"""Memory over time: a synthetic trace and a fake CUDA snapshot read exactly, and one real CPU step of the
course's GPT whose measured peak and its phase agree with chapter 7's `predict_peak`."""

from __future__ import annotations

import pytest

from distlab.memory import MemoryConfig, predict_peak
from distlab.observe.allocations import curve_from_trace, gpt_step_curve, snapshot_curve


def _mem(ts: float, total: int, device_type: int = 0) -> dict:
    return {"ph": "i", "name": "[memory]", "ts": ts,
            "args": {"Total Allocated": total, "Device Type": device_type}}


def test_a_trace_curve_finds_its_peak_and_phase() -> None:
    trace = {"traceEvents": [
        {"ph": "X", "name": "distlab:forward", "ts": 1000, "dur": 100},
        {"ph": "X", "name": "distlab:backward", "ts": 1100, "dur": 200},
        {"ph": "X", "name": "distlab:optimizer", "ts": 1300, "dur": 50},
        _mem(1010, 64), _mem(1090, 512), _mem(1150, 1024), _mem(1200, 256), _mem(1320, 700),
        _mem(1150, 99999, device_type=1)]}
    curve = curve_from_trace(trace, baseline=1000)
    assert curve.live == (1064, 1512, 2024, 1256, 1700)
    assert (curve.peak_bytes, curve.peak_phase) == (2024, "backward")
    assert curve.peak_time == pytest.approx(150e-6)
    with pytest.raises(ValueError, match="no memory events"):
        curve_from_trace({"traceEvents": trace["traceEvents"][:3]}, 0)


def test_a_fake_cuda_snapshot_is_read_as_live_bytes() -> None:
    snapshot = {"device_traces": [[
        {"action": "segment_alloc", "size": 2 << 20, "time_us": 0},
        {"action": "alloc", "size": 512, "time_us": 10},
        {"action": "alloc", "size": 1024, "time_us": 20},
        {"action": "free_requested", "size": 512, "time_us": 25},
        {"action": "free_completed", "size": 512, "time_us": 30},
        {"action": "alloc", "size": 256, "time_us": 40}]]}
    times, live = snapshot_curve(snapshot, baseline=100)
    assert live == (612, 1636, 1124, 1380)
    assert times == pytest.approx((0.0, 10e-6, 20e-6, 30e-6))
    with pytest.raises(ValueError, match="no trace of device 1"):
        snapshot_curve(snapshot, device=1)


def test_a_cpu_step_of_the_gpt_peaks_where_chapter_7_says() -> None:
    config = MemoryConfig(layers=2, hidden=64, heads=4, vocab=256, seq=32, micro_batch=8, precision="fp32",
                          recompute="none", attention="flash", dropout=False, adam="for-loop", device="cpu")
    predicted = predict_peak(config)
    curve = gpt_step_curve(layers=2, hidden=64, heads=4, vocab=256, batch=8, seq=32)
    assert curve.peak_phase == predicted.phase == "backward"
    assert curve.peak_bytes == pytest.approx(predicted.peak_bytes, rel=0.01)
    assert list(curve.phases) == ["forward", "backward", "optimizer"]
