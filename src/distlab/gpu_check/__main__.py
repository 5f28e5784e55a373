"""`python -m distlab.gpu_check` (what `make gpu-check` runs): everything that needs CUDA, on this node.

1. `pytest -m gpu` on the repository's tests (tests/gpu_check/test_gpu*.py and the others marked gpu):
   every chapter on NCCL at world size 1 and at one rank per GPU, gloo over CUDA tensors, every
   chapter's multi-rank code with several ranks sharing cuda:0 under the strict device rule, chapter 7's
   measured peak against its prediction;
2. every lab under nbval (`labs.run_labs`), twice: on the node's GPUs as they are ("gpus": NCCL with a GPU
   per rank where there are enough) and with every rank on one shared GPU ("shared": gloo over cuda:0);
   per lab, how many cells passed and failed;
3. the measurements: chapter 7's peak against its prediction (`bench`), one transformer block's kernel
   efficiency eta for chapter 9's planner (`block`), host-to-device, device-to-host, device-to-device and
   GPU-to-GPU bandwidth (chapter 8), the all_reduce bus bandwidth over every GPU (chapter 1), the GEMM
   and cast grid with FP8 against bf16 beside chapter 7's model (`gemm`), and the course's GPT's step time
   and peak beside chapter 9's models (`step`, with the rates `gemm` fitted);
4. one report, JSON and text, under assets/gpu/ (`report`), naming the GPU, driver, CUDA, NCCL and torch.

Exit status 0 only if every test passed, every lab's cells passed in both modes, and every measurement
ran. Without CUDA it says it found no GPU, runs and writes nothing, and exits 0: a CPU machine claims
nothing about the GPU path.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch

from distlab.gpu_check import bench, block, environment, gemm, labs, report, step

ROOT = Path(__file__).resolve().parents[3]  # the repository: src/distlab/gpu_check/__main__.py
NO_GPU = ("distlab gpu-check: found no GPU (torch.cuda.is_available() is False); nothing was run, nothing "
          "was written, and nothing is claimed about the GPU path. Run it on a node with an NVIDIA GPU.")


def parser() -> argparse.ArgumentParser:
    """The options, each with its default in the help."""
    p = argparse.ArgumentParser(prog="python -m distlab.gpu_check", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "assets" / "gpu"), help="folder the report is written to")
    p.add_argument("--tests", default=str(ROOT / "tests"), help="the tests folder pytest -m gpu runs")
    p.add_argument("--no-measure", action="store_true", help="run the gpu tests only, not the measurements")
    p.add_argument("--no-labs", action="store_true", help="do not run the labs under nbval")
    p.add_argument("--lab-modes", nargs="+", choices=sorted(labs.MODES), default=["gpus", "shared"],
                   help="how the labs' ranks use the GPUs: as the node has them, or all on cuda:0")
    return p


def gpu_test_files(tests: str) -> list[str]:
    """The test files under `tests`, in every subfolder, that hold tests marked `gpu`: importing the
    others would only skip or deselect them."""
    return sorted(str(f) for f in Path(tests).rglob("test_*.py") if "pytest.mark.gpu" in f.read_text())


def run_tests(tests: str) -> tuple[list[dict], int]:
    """`pytest -m gpu` in a child process (a fresh CUDA context, its output shown as it runs); the
    outcome of every test and pytest's exit status."""
    files = gpu_test_files(tests)
    with tempfile.TemporaryDirectory(prefix="distlab-gpu-check-") as tmp:
        xml = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-m", "gpu", *files, "-p", "no:cacheprovider", "-rA",
                   f"--junitxml={xml}", "-o", "addopts="]
        status = subprocess.call(command, cwd=ROOT)
        return (report.test_outcomes(xml) if xml.is_file() else []), status


def measure(out: dict) -> None:
    """Every measurement into `out`; one that raises is recorded in out["errors"], the others still run."""
    for key, fn in (("memory", bench.memory_check), ("block", block.block_efficiency),
                    ("bandwidth", bench.bandwidth), ("busbw", bench.busbw),
                    ("gemm", gemm.measure), ("step", partial(step.measure_with, out))):
        try:
            out[key] = fn()
        except Exception:
            out.setdefault("errors", []).append(f"{key}: {traceback.format_exc().strip().splitlines()[-1]}")
    bad = [r for r in out.get("memory", []) if not r["within_tolerance"]]
    if bad:
        out.setdefault("errors", []).append(f"memory: {len(bad)} case(s) outside the tolerance")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU)
        return 0
    out: dict = {"environment": environment.facts()}
    out["tests"], status = run_tests(args.tests)
    out["pytest_status"] = status
    if not args.no_labs:
        for mode in args.lab_modes:
            rows, lab_status = labs.run_labs(ROOT, mode)
            out.setdefault("labs", {})[mode] = {"labs": rows, "pytest_status": lab_status}
    if not args.no_measure:
        measure(out)
    js, txt = report.write(out, args.out, environment.slug(out["environment"]))
    print(txt.read_text(), end="")
    print(f"report: {js} and {txt}")
    return 0 if report.passed(out) else 1


if __name__ == "__main__":
    sys.exit(main())
