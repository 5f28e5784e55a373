"""`make gpu-check`'s driver on a machine without a GPU: it claims nothing; and its report, from the
outcomes pytest writes (JUnit XML) to the JSON and text it keeps. Pure Python, no ranks, no GPU."""

from __future__ import annotations

import json

import pytest
import torch

from distlab.gpu_check import report
from distlab.gpu_check.__main__ import NO_GPU, gpu_test_files, main
from distlab.gpu_check.environment import facts, slug

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.gpu_check.test_gpu" name="test_every_chapter_on_nccl[1]" time="9.1"/>
<testcase classname="tests.gpu_check.test_gpu" name="test_gloo_over_cuda_tensors" time="3.0">
<failure message="AssertionError: sum differs">trace</failure></testcase>
<testcase classname="tests.gpu_check.test_gpu" name="test_cuda_peak_matches_the_predicted_peak" time="0.0">
<skipped type="pytest.skip" message="needs a CUDA GPU">skip</skipped></testcase>
</testsuite></testsuites>"""
ENV = {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_GiB": 79.1,
                 "compute_capability": "9.0"}], "driver": "550.54.15", "cuda": "12.4", "nccl": "2.21.5",
       "torch": "2.13.0", "python": "3.11.9", "platform": "Linux x86_64"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: gpu-check would run")
def test_without_a_gpu_it_says_so_writes_nothing_and_exits_0(tmp_path, capsys):
    out = tmp_path / "gpu"
    assert main(["--out", str(out)]) == 0
    assert capsys.readouterr().out == NO_GPU + "\n" and "nothing is claimed" in NO_GPU
    assert not out.exists()
    assert facts()["gpus"] == [] and facts()["torch"] == torch.__version__


def test_the_report_names_the_node_and_every_test_that_did_not_pass(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text(JUNIT)
    tests = report.test_outcomes(xml)
    assert [t["outcome"] for t in tests] == ["passed", "failed", "skipped"]
    assert tests[1] == {"test": "tests/gpu_check/test_gpu.py::test_gloo_over_cuda_tensors",
                        "outcome": "failed", "message": "AssertionError: sum differs"}
    run = {"environment": ENV, "tests": tests, "pytest_status": 1}
    assert not report.passed(run)
    assert not report.passed(run | {"tests": [tests[0], tests[2]], "pytest_status": 0})  # a skip is no pass
    assert not report.passed({"environment": ENV, "tests": [], "pytest_status": 0})  # nothing ran
    assert report.passed(run | {"tests": [tests[0]], "pytest_status": 0})
    small = {"test": "tests/t.py::two", "outcome": "skipped", "message": "needs at least 2 CUDA GPUs: ..."}
    assert report.passed(run | {"tests": [tests[0], small], "pytest_status": 0})  # the node is too small
    assert not report.passed(run | {"tests": [small], "pytest_status": 0})  # but something must have run
    name = slug(ENV)
    assert name == "nvidia-h100-80gb-hbm3-x1"
    js, txt = report.write(run, tmp_path / "gpu", name)
    assert json.loads(js.read_text())["environment"]["nccl"] == "2.21.5"
    text = txt.read_text()
    assert text.startswith("distlab gpu-check: FAILED\nGPUs: cuda:0 NVIDIA H100 80GB HBM3 (79.1 GiB, sm 9.0)")
    assert "driver 550.54.15, CUDA 12.4, NCCL 2.21.5, torch 2.13.0" in text
    assert "tests (pytest -m gpu): 1 passed, 1 failed, 0 error, 1 skipped" in text
    assert ("FAILED: tests/gpu_check/test_gpu.py::test_gloo_over_cuda_tensors: AssertionError: sum differs"
            in text)


def test_the_timed_block_is_the_planners_block_on_one_gpu_of_tp():
    """gpu_check.block: this GPU's share holds W/t of the block's matrices, and its FLOPs are the planner's
    3 b s (2 W + 4 s h) / t (the numbers eta is made of); it runs on the CPU too (tiny shape)."""
    from distlab.gpu_check.block import SHAPES, BlockShape, _weights, block_forward, catalog_gpu, time_block
    from distlab.memory.estimate.shape import block_weights
    from distlab.plan.cost_model import layer_flops_per_token
    from distlab.plan.inputs import ModelSpec

    tiny = (BlockShape("tiny-gqa", 64, 8, 2, 96, True, 16, 2, 2),
            BlockShape("tiny", 48, 4, 4, 192, False, 8, 3, 4))
    for s in tiny:
        w = _weights(s, torch.device("cpu"), torch.float64)
        matrices = sum(t.numel() for name, t in w.items() if not name.startswith("ln"))
        assert matrices * s.tp == block_weights(s.hidden, s.heads, s.kv_heads, s.ffn, s.gated)
        x = torch.randn(s.batch, s.seq, s.hidden, dtype=torch.float64)
        assert block_forward(x, w, s).shape == x.shape
        model = ModelSpec(layers=1, hidden=s.hidden, heads=s.heads, vocab=1, seq=s.seq, kv_heads=s.kv_heads,
                          ffn=s.ffn, gated=s.gated)
        assert s.flops() == 3 * s.batch * s.seq * layer_flops_per_token(model) / s.tp
        row = time_block(s, torch.device("cpu"), torch.float32, repeats=1, warmup=0, gpu="H100")
        assert row.forward_ms > 0 and row.backward_ms > 0 and row.peak_tflops == 989.4
    assert [s.name for s in SHAPES] == ["korthikanti-22b", "llama3-405b"]
    assert catalog_gpu("NVIDIA H100 80GB HBM3") == "H100" and catalog_gpu("NVIDIA A100-SXM4-40GB") == "A100"
    assert catalog_gpu("Tesla T4") is None
    with pytest.raises(ValueError, match="kv_heads=2 is not divisible by tp=4"):
        BlockShape("bad", 64, 8, 2, 96, True, 16, 2, 4)
    with pytest.raises(ValueError, match="repeats=0"):
        time_block(SHAPES[0], torch.device("cpu"), repeats=0)


def test_the_book_quotes_the_committed_gpu_report():
    """Chapter 8's table of H100 bandwidths copies assets/gpu's report (written by make gpu-check on that
    node): every number in the book is the report's, rounded as printed."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "assets" / "gpu" / "nvidia-h100-80gb-hbm3-x1.json").read_text())
    assert report.passed(data) and data["environment"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    book = (root / "book" / "08-hardware.md").read_text()
    rows = {"H2D pinned": "host to device, pinned", "D2H pinned": "device to host, pinned",
            "H2D pageable": "host to device, pageable", "D2H pageable": "device to host, pageable",
            "D2D": "device to device"}
    for row in data["bandwidth"]:
        if row["test"] in rows:
            line = next(x for x in book.splitlines() if x.startswith(f"| {rows[row['test']]}"))
            assert f"{row['measured_GBps']:.1f} GB/s" in line, (row["test"], line)
            assert f"{row['percent_of_spec']:.0f} %" in line, (row["test"], line)


def test_make_gpu_check_finds_the_gpu_tests_in_the_subfolders():
    """tests/ mirrors src/distlab in subfolders; `pytest -m gpu` must still be handed every file with gpu
    tests (it looked in tests/ itself only, and would have run none)."""
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    files = {Path(f).relative_to(tests).as_posix() for f in gpu_test_files(str(tests))}
    assert {"gpu_check/test_gpu.py", "gpu_check/test_gpu_check_shared.py",
            "tensor_parallel/test_tensor_parallel_overlap.py"} <= files, files
    assert all("pytest.mark.gpu" in (tests / f).read_text() for f in files)
