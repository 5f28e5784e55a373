"""The pure parts of gpu-check's GEMM/FP8 and step-time measurements (`gpu_check.gemm`, `gpu_check.step`),
with fake measurements: fitting the grid, the comparisons, the verdicts, the report's lines; and that both
skip cleanly without CUDA."""

from __future__ import annotations

import pytest
import torch

from distlab import kernel_rates
from distlab.gpu_check import gemm, step
from distlab.plan import kernel_time

ISSUE_ROWS = [{"d": d, "speedup": r} for d, r in kernel_rates.H200_FP8_SPEEDUP]


def test_measured_break_even_interpolates_in_log_d() -> None:
    assert gemm.measured_break_even(ISSUE_ROWS) == pytest.approx(8192)
    rows = [{"d": 1024, "speedup": 0.5}, {"d": 4096, "speedup": 1.5}]
    assert gemm.measured_break_even(rows) == pytest.approx(2048)  # halfway in log d
    assert gemm.measured_break_even([{"d": 1024, "speedup": 0.5}]) is None
    assert gemm.measured_break_even([{"d": 1024, "speedup": 1.2}]) == 1024


def test_grid_fit_and_fp8_comparison_with_fake_timings() -> None:
    bf16 = kernel_rates.GemmCurve(0.7, 3e9, kernel_rates.SPECS["H200"][0], "fake")
    fp8 = kernel_rates.GemmCurve(0.6, 3e9, kernel_rates.SPECS["H200"][1], "fake")
    cast = kernel_rates.CastCost(0.3, 5e-6, kernel_rates.SPECS["H200"][2], "fake")
    shapes = [(d, d, d) for d in gemm.SQUARE]
    section = {"device": "NVIDIA H200",
               "bf16": [{"m": m, "n": n, "k": k, "seconds": bf16.seconds(m, n, k)} for m, n, k in shapes],
               "fp8": [{"m": m, "n": n, "k": k, "seconds": fp8.seconds(m, n, k)} for m, n, k in shapes],
               "cast": [{"values": v, "seconds": cast.seconds(v)} for v in gemm.CAST_SIZES],
               "host_sync_seconds": 3e-5}
    rates = gemm.fit(section, "H200")
    assert (rates.bf16.e_max, rates.fp8.e_max, rates.cast.hbm_fraction) == (
        pytest.approx(0.7), pytest.approx(0.6), pytest.approx(0.3))
    speedups = [{"d": d, "speedup": kernel_rates.fp8_speedup(d, bf16, fp8, cast)} for d in gemm.SPEEDUP_SIZES]
    got = gemm.compare_fp8(speedups, "H200", rates)
    for row in got["rows"]:  # the model with the fitted rates reproduces what they produced
        assert row["fitted"] == pytest.approx(row["measured"], rel=1e-6)
    assert got["within_goal"]
    section["fitted"] = {"bf16": vars(rates.bf16), "fp8": vars(rates.fp8), "cast": vars(rates.cast)}
    section["grid"] = gemm.grid_comparison(section["bf16"], bf16)  # against the curve that made them
    assert section["grid"]["min_ratio"] == pytest.approx(1) == section["grid"]["max_ratio"]
    half = kernel_rates.GemmCurve(0.35, 3e9, bf16.peak, "half")  # half the efficiency: twice the time
    assert gemm.grid_comparison(section["bf16"], half)["max_ratio"] == pytest.approx(2)
    assert section["grid"]["rows"][0]["measured_efficiency"] == pytest.approx(bf16.efficiency(2 * 512**3))
    section["comparison"] = got
    text = "\n".join(gemm.render_lines(section))
    assert "gemm bf16: e_max 0.70 of peak, half of it at 3.0 GFLOP (6 shapes timed)" in text
    assert "cast bf16->e4m3 (compiled): 30 % of the HBM roofline + 5.0 us" in text
    assert "host synchronisation (MasterWeights' check, per parameter tensor): 30.0 us" in text
    assert "predicted / measured time 1.00 to 1.00 over 6 shapes" in text
    assert rates.sync_s == 3e-5
    assert "fp8 break-even: measured" in text and "(within 1.5x)" in text


def test_the_issue_measurement_against_chapter_7s_models() -> None:
    got = gemm.compare_fp8(ISSUE_ROWS, "H200")
    assert got["measured_break_even"] == pytest.approx(8192)
    assert got["predicted_break_even"]["roofline"] == pytest.approx(2061, rel=0.01)  # 4x off
    assert got["within_goal"]  # the fallback's break-even within 1.5x
    issue_model = [0.66, 1.00, 1.33, 1.60, 1.78]  # the roofline's numbers that issue 35 quotes
    assert [round(r["roofline"], 2) for r in got["rows"]] == issue_model
    far = gemm.compare_fp8([{"d": 1024, "speedup": 0.1}, {"d": 65536, "speedup": 1.1}], "H200")
    assert not far["within_goal"] and "OUTSIDE" in gemm.render_lines({"comparison": far})[-1]


def test_step_comparison_and_its_lines_with_fake_measurements() -> None:
    rates = kernel_time.fallback_rates("H200")
    name, layers, hidden, heads, batch, seq = step.SHAPES[0]
    model = step.spec(name, layers, hidden, heads, seq)
    predicted = step.predictions(model, batch, rates, 0.52)
    shape = {"layers": layers, "hidden": hidden, "heads": heads, "batch": batch, "seq": seq,
             "vocab": step.VOCAB}
    rows = [{"name": name, "shape": shape, "measured_s": 1.1 * predicted["parts_s"],
             "measured_peak_bytes": int(10e9), "predicted_peak_bytes": int(9e9)},
            {"name": name, "shape": shape, "measured_s": 2 * predicted["parts_s"]}]
    got = step.compare_steps(rows, rates, 0.52)
    assert got[0]["parts_ratio"] == pytest.approx(1 / 1.1) and got[0]["within_goal"]
    assert got[1]["parts_ratio"] == pytest.approx(0.5) and not got[1]["within_goal"]
    assert got[0]["block_ratio"] == pytest.approx(predicted["block_s"] / rows[0]["measured_s"])
    lines = step.render_lines(got)
    assert "(0.91x, within 20 %)" in lines[0] and "peak 10.00 GB, predicted 9.00" in lines[0]
    assert "(0.50x, OUTSIDE 20 %)" in lines[1] and "peak" not in lines[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path without CUDA")
def test_without_cuda_nothing_is_timed() -> None:
    assert gemm.measure() == {"skipped": "no CUDA GPU: nothing timed"}
    assert step.measure() == []
    assert gemm.render_lines(None) == [] and step.render_lines(None) == []


def test_the_text_report_carries_both_comparisons() -> None:
    from distlab.gpu_check import report

    env = {"gpus": [{"index": 0, "name": "NVIDIA H200", "memory_GiB": 139.8, "compute_capability": "9.0"}],
           "driver": "x", "cuda": "x", "nccl": "x", "torch": "x", "python": "x", "platform": "x"}
    comparison = gemm.compare_fp8(ISSUE_ROWS, "H200")
    rates = kernel_time.fallback_rates("H200")
    model = step.spec("gpt2-small", 12, 768, 12, 1024)
    measured = {"name": "gpt2-small", "measured_s": step.predictions(model, 8, rates, 0.52)["parts_s"],
                "shape": {"layers": 12, "hidden": 768, "heads": 12, "batch": 8, "seq": 1024,
                          "vocab": step.VOCAB}}
    text = report.render({"environment": env, "tests": [], "gemm": {"comparison": comparison},
                          "step": step.compare_steps([measured], rates, 0.52)})
    assert "fp8/bf16 d=8192: measured 1.00x, roofline 1.60x" in text
    assert "step gpt2-small (h=768, b=8): measured" in text and "(1.00x, within 20 %)" in text
