"""`make gpu-check`'s labs on CPU, from fake inputs: nbval's JUnit XML read back into per-lab cell counts,
and those counts in the report (JSON and text) and its verdict. No lab runs here, and no GPU is needed.

The XML below is what `pytest --nbval --nbval-current-env --junitxml=...` wrote for a three-cell notebook
(`labs/99_tiny.ipynb`: one cell whose output matches, one whose stored output differs, one that raises),
with the run's timestamp and host name blanked; a second lab's cell is added by hand to show two labs.
"""

from __future__ import annotations

import json

import pytest

from distlab.gpu_check import labs, report

NBVAL_XML = (
    '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" '
    'errors="0" failures="2" skipped="0" tests="4" time="2.534" timestamp="" hostname="">'
    '<testcase classname="labs.99_tiny.ipynb" name="Cell 0" time="2.007" />'
    '<testcase classname="labs.99_tiny.ipynb" name="Cell 1" time="0.019"><failure message="#x1B[91mNotebook '
    'cell execution failed#x1B[0m&#10;#x1B[94mCell 1: Cell outputs differ">#x1B[91mNotebook cell execution '
    "failed#x1B[0m\n#x1B[94mCell 1: Cell outputs differ\n\nInput:\n#x1B[0mprint(2)\n\n#x1B[94mTraceback:"
    "#x1B[0m\n#x1B[94m mismatch 'stdout'#x1B[91m\n\n assert reference_output == test_output failed:\n\n"
    "  '3\\n' == '2\\n'\n  \n  - 2\n  + 3\n#x1B[0m\n</failure></testcase>"
    '<testcase classname="labs.99_tiny.ipynb" name="Cell 2" time="0.311"><failure message="#x1B[91mNotebook '
    'cell execution failed#x1B[0m">#x1B[91mNotebook cell execution failed#x1B[0m\n#x1B[94mCell 2: Cell '
    "execution caused an exception\n\nInput:\n#x1B[0mraise ValueError('boom')\n\n#x1B[94mTraceback:#x1B[0m"
    "\n\n#x1B[31m------------------#x1B[39m\n#x1B[31mValueError#x1B[39m       Traceback (most recent call "
    "last)\n#x1B[31mValueError#x1B[39m: boom\n</failure></testcase>"
    '<testcase classname="labs.01_collectives.ipynb" name="Cell 4" time="1.0" />'
    "</testsuite></testsuites>")
ENV = {"gpus": [{"index": 0, "name": "NVIDIA H200", "memory_GiB": 139.8, "compute_capability": "9.0"}],
       "driver": "580.0", "cuda": "13.0", "nccl": "2.28.9", "torch": "2.11.0+cu130", "python": "3.12.3",
       "platform": "Linux x86_64"}
PASSING_TEST = {"test": "tests/gpu_check/test_gpu.py::test_every_chapter_on_nccl[1]", "outcome": "passed",
                "message": ""}


@pytest.fixture
def rows(tmp_path):
    xml = tmp_path / "labs.xml"
    xml.write_text(NBVAL_XML)
    return labs.lab_results(xml)


def test_nbvals_xml_becomes_cell_counts_per_lab_with_each_failure_in_one_line(rows):
    assert [r["lab"] for r in rows] == ["01_collectives", "99_tiny"]
    assert rows[0] == {"lab": "01_collectives", "passed": 1, "failed": 0, "error": 0, "skipped": 0,
                       "failures": []}
    tiny = rows[1]
    assert (tiny["passed"], tiny["failed"], tiny["error"], tiny["skipped"]) == (1, 2, 0, 0)
    assert tiny["failures"] == ["Cell 1: Cell outputs differ (mismatch 'stdout')",
                                "Cell 2: Cell execution caused an exception: ValueError: boom"]
    assert not labs.labs_passed(rows) and labs.labs_passed(rows[:1]) and not labs.labs_passed([])


def test_the_report_lists_each_lab_and_fails_when_a_cell_fails(rows, tmp_path):
    good = {"labs": rows[:1], "pytest_status": 0}
    run = {"environment": ENV, "tests": [PASSING_TEST], "pytest_status": 0,
           "labs": {"gpus": good, "shared": {"labs": rows, "pytest_status": 1}}}
    assert not report.passed(run)
    assert report.passed(run | {"labs": {"gpus": good, "shared": good}})
    assert report.passed(run | {"labs": {}}) and report.passed({k: v for k, v in run.items() if k != "labs"})
    js, txt = report.write(run, tmp_path / "gpu", "nvidia-h200-x1")
    assert json.loads(js.read_text())["labs"]["shared"]["labs"][1]["failed"] == 2
    text = txt.read_text().splitlines()
    assert text[0] == "distlab gpu-check: FAILED"
    start = text.index("labs (the node's GPUs, NCCL with a GPU per rank where there are enough): PASSED, "
                       "1 labs, cells 1 passed, 0 failed, 0 error")
    assert text[start + 1] == "  01_collectives: 1 passed, 0 failed, 0 error"
    assert text[start + 2:start + 7] == [
        "labs (every rank on cuda:0, gloo over CUDA tensors): FAILED, 2 labs, cells 2 passed, 2 failed, "
        "0 error (pytest exit status 1)",
        "  01_collectives: 1 passed, 0 failed, 0 error",
        "  99_tiny: 1 passed, 2 failed, 0 error",
        "    Cell 1: Cell outputs differ (mismatch 'stdout')",
        "    Cell 2: Cell execution caused an exception: ValueError: boom"]


def test_a_lab_mode_must_be_known(tmp_path):
    with pytest.raises(ValueError, match="mode='all' is not known; use one of gpus, shared"):
        labs.run_labs(tmp_path, "all")
    assert labs.MODES["shared"] == {"CUDA_VISIBLE_DEVICES": "0", "DISTLAB_DEVICE": "cuda"}
