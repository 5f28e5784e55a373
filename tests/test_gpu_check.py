"""`make gpu-check`'s driver on a machine without a GPU: it claims nothing; and its report, from the
outcomes pytest writes (JUnit XML) to the JSON and text it keeps. Pure Python, no ranks, no GPU."""

from __future__ import annotations

import json

import pytest
import torch

from distlab.gpu_check import report
from distlab.gpu_check.__main__ import NO_GPU, main
from distlab.gpu_check.environment import facts, slug

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_gpu" name="test_every_chapter_on_nccl[1]" time="9.1"/>
<testcase classname="tests.test_gpu" name="test_gloo_over_cuda_tensors" time="3.0">
<failure message="AssertionError: sum differs">trace</failure></testcase>
<testcase classname="tests.test_gpu" name="test_cuda_peak_matches_the_predicted_peak" time="0.0">
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
    assert tests[1] == {"test": "tests/test_gpu.py::test_gloo_over_cuda_tensors", "outcome": "failed",
                        "message": "AssertionError: sum differs"}
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
    assert "FAILED: tests/test_gpu.py::test_gloo_over_cuda_tensors: AssertionError: sum differs" in text
