"""The report of one `make gpu-check`: the node, every gpu test's outcome, every measurement; as JSON and
as a short text, both under assets/gpu/ (named after the GPU, `environment.slug`).

`test_outcomes` reads pytest's JUnit XML (what `pytest --junitxml` writes): one outcome per test,
"passed", "failed", "error" or "skipped", with the message of a failure. `passed(report)` is the
verdict the command's exit status gives: at least one gpu test ran, every one passed, and no measurement
failed. A skip is no pass (on a GPU node "needs a CUDA GPU" means the GPU path did not run), with one
exception: a test that needs more GPUs than the node has says so with a reason that starts with
`NODE_TOO_SMALL` ("needs at least 2 CUDA GPUs ..."), and its skip is the node's size, listed, not a failure.
When the labs ran (`labs.py`), every cell of every lab must pass in each mode, and the text lists each
lab's counts and failures.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from distlab.gpu_check import gemm, step
from distlab.gpu_check.labs import labs_passed


def test_outcomes(junit_xml: str | Path) -> list[dict]:
    """[{"test": "tests/gpu_check/test_gpu.py::name[param]", "outcome": ..., "message": ...}] from a
    JUnit XML file."""
    rows = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = "failed" if tag == "failure" else tag
                message = (child.get("message") or child.text or "").strip().splitlines()[0:1]
                message = message[0] if message else ""
                break
        rows.append({"test": name, "outcome": outcome, "message": message})
    return rows


NODE_TOO_SMALL = "needs at least"  # how a gpu test that needs more GPUs than the node has words its skip


def too_small(test: dict) -> bool:
    """A skip that only says the node has too few GPUs for this test."""
    return test["outcome"] == "skipped" and test["message"].startswith(NODE_TOO_SMALL)


def passed(report: dict) -> bool:
    """At least one gpu test passed, every other one passed or was skipped for want of GPUs (`too_small`),
    every lab run (when the labs ran) passed every cell, and every measurement succeeded."""
    tests = report.get("tests", [])
    return (any(t["outcome"] == "passed" for t in tests)
            and all(t["outcome"] == "passed" or too_small(t) for t in tests)
            and all(labs_passed(run["labs"]) and not run["pytest_status"]
                    for run in report.get("labs", {}).values())
            and not report.get("errors") and not report.get("pytest_status"))


def render(report: dict) -> str:
    """The short text: the node, a line per test that did not pass, the counts, the measurements."""
    lines = _node_lines(report)
    lines += _test_lines(report.get("tests", []))
    for mode, run in report.get("labs", {}).items():
        lines += lab_lines(mode, run)
    lines += [_memory_line(row) for row in report.get("memory", [])]
    lines += [_block_line(row) for row in report.get("block", [])]
    lines += gemm.render_lines(report.get("gemm")) + step.render_lines(report.get("step"))
    lines += [_bandwidth_line(row)
              for row in [*report.get("bandwidth", []), *([report["busbw"]] if report.get("busbw") else [])]]
    lines += [f"ERROR in {e}" for e in report.get("errors", [])]
    return "\n".join(lines) + "\n"


def _node_lines(report: dict) -> list[str]:
    """The verdict, the GPUs and the software versions."""
    env = report["environment"]
    gpus = ", ".join(f"cuda:{g['index']} {g['name']} ({g['memory_GiB']} GiB, sm {g['compute_capability']})"
                     for g in env["gpus"])
    return [f"distlab gpu-check: {'PASSED' if passed(report) else 'FAILED'}",
            f"GPUs: {gpus}",
            f"driver {env['driver']}, CUDA {env['cuda']}, NCCL {env['nccl']}, torch {env['torch']}, "
            f"Python {env['python']}, {env['platform']}"]


def _test_lines(tests: list[dict]) -> list[str]:
    """The counts of outcomes, then a line per test that did not pass."""
    counts = {o: sum(t["outcome"] == o for t in tests) for o in ("passed", "failed", "error", "skipped")}
    lines = ["tests (pytest -m gpu): " + ", ".join(f"{n} {o}" for o, n in counts.items())]
    lines += [f"  {t['outcome'].upper()}{' (node too small)' if too_small(t) else ''}: {t['test']}: "
              f"{t['message']}" for t in tests if t["outcome"] != "passed"]
    return lines


def lab_lines(mode: str, run: dict) -> list[str]:
    """The labs of one mode: the totals, a line per lab with its cell counts, each failure under it."""
    rows = run["labs"]
    cells = {o: sum(r[o] for r in rows) for o in ("passed", "failed", "error")}
    lines = [f"labs ({MODE_WORDS.get(mode, mode)}): {'PASSED' if labs_passed(rows) else 'FAILED'}, "
             f"{len(rows)} labs, cells {cells['passed']} passed, {cells['failed']} failed, "
             f"{cells['error']} error" + (f" (pytest exit status {run['pytest_status']})"
                                          if run["pytest_status"] else "")]
    for r in rows:
        lines.append(f"  {r['lab']}: {r['passed']} passed, {r['failed']} failed, {r['error']} error"
                     + (f", {r['skipped']} skipped" if r["skipped"] else ""))
        lines += [f"    {f}" for f in r["failures"]]
    return lines


MODE_WORDS = {"gpus": "the node's GPUs, NCCL with a GPU per rank where there are enough",
              "shared": "every rank on cuda:0, gloo over CUDA tensors"}


def _memory_line(row: dict) -> str:
    """One measured peak against the estimator's."""
    return (f"memory {row['precision']}/{row['recompute']} L={row['shape']['layers']} "
            f"h={row['shape']['hidden']}: measured {row['measured_peak_bytes'] / 2**20:.1f} MiB, "
            f"predicted {row['predicted_peak_bytes'] / 2**20:.1f} MiB "
            f"({100 * row['relative_error']:+.1f} %, tolerance {100 * row['tolerance']:.0f} %)")


def _block_line(row: dict) -> str:
    """One transformer block's timing and its share of the GPU's peak."""
    eta = "" if row["eta"] is None else f", eta {row['eta']:.2f} of {row['peak_tflops']} TFLOP/s"
    return (f"block {row['name']} ({row['dtype']}, one GPU of tp=8, no communication): forward "
            f"{row['forward_ms']:.2f} ms, backward {row['backward_ms']:.2f} ms, "
            f"{row['tflops']:.0f} TFLOP/s{eta}")


def _bandwidth_line(row: dict) -> str:
    """One bandwidth measurement against its specification."""
    got = "-" if row.get("measured_GBps") is None else f"{row['measured_GBps']:.1f} GB/s"
    percent = row.get("percent_of_spec")
    spec = f", {percent:.0f} % of {row.get('spec', '')}" if percent else ""
    return f"{row['test']}: {got}{spec} ({row.get('note', '')})"


def write(report: dict, out_dir: str | Path, name: str) -> tuple[Path, Path]:
    """Write `name`.json and `name`.txt into `out_dir` (made if missing); return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js, txt = out / f"{name}.json", out / f"{name}.txt"
    js.write_text(json.dumps(report, indent=1, default=str) + "\n")
    txt.write_text(render(report))
    return js, txt
