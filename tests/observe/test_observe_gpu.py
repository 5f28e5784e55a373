"""Chapter 13 on CUDA, run by `make gpu-check` (`pytest -m gpu`); skipped where there is no GPU, so these
have not run on the CPU machines the chapter was written on:
- one GPT step's memory curve on a GPU (profiler memory events of device type 1) peaks in the phase
  chapter 7 predicts, and the allocator snapshot written beside it (for memory_viz) reads back as a curve;
- on 2 or more GPUs, the traced overlapped step on NCCL: the trace's NCCL kernels, `comm_log` and chapter
  2's timeline count the same all-reduces."""

from __future__ import annotations

import pickle

import pytest
import torch

from distlab.memory import MemoryConfig, predict_peak
from distlab.observe.allocations import gpt_step_curve, snapshot_curve

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]


def test_a_gpu_step_peaks_in_the_predicted_phase_and_writes_a_snapshot(tmp_path) -> None:
    config = MemoryConfig(layers=2, hidden=64, heads=4, vocab=256, seq=32, micro_batch=8, precision="fp32",
                          recompute="none", attention="flash", dropout=False, adam="for-loop", device="cuda")
    predicted = predict_peak(config)
    path = tmp_path / "step.pickle"
    curve = gpt_step_curve(layers=2, hidden=64, heads=4, vocab=256, batch=8, seq=32,
                           device=torch.device("cuda", 0), snapshot_to=path)
    assert curve.peak_phase == predicted.phase
    assert curve.peak_bytes == pytest.approx(predicted.peak_bytes, rel=0.05)
    times, live = snapshot_curve(pickle.loads(path.read_bytes()))
    assert len(times) == len(live) > 0


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs for NCCL ranks")
def test_nccl_kernels_count_the_same_all_reduces_as_comm_log(tmp_path) -> None:
    from distlab.observe.measured import measure_overlap

    rows, _ = measure_overlap(tmp_path, world_size=2, steps=2, variants=[("overlapped", 1)])
    for row in rows:
        assert row.trace.comm_spans == row.comm_log_calls == row.timeline_calls, row
