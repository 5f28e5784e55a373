"""Every lab under nbval on this node, as CI runs them, and what each lab's cells did.

`run_labs` runs `pytest --nbval --nbval-current-env --nbval-sanitize-with labs/nbval-sanitize.cfg` on
every lab in a child process, in one of two modes:

- "gpus": the node as it is: a lab's `run(fn, p)` gets NCCL with one GPU per rank where the node has p
  GPUs or more, else gloo on the CPU (`launch.resolve_backend`);
- "shared": one GPU (CUDA_VISIBLE_DEVICES=0) that every rank shares: DISTLAB_DEVICE=cuda puts the gloo
  ranks' tensors on it (`launch.devices`), so a node with fewer GPUs than ranks still runs the labs with
  their tensors on a GPU. gloo's send and recv take host memory only: the course's point-to-point
  messages stage CUDA tensors through it (`distlab.staged_p2p`), and lab 1's ring exercise, whose
  function sends by itself, is checked with CPU tensors there (`own_messages_device`).

Both record the labs' progress in a temporary file (never a student's ~/.distlab) and write pytest's
JUnit XML, which `lab_results` reads back: per lab, how many cells passed, failed or errored, and the
first line of each failure. A lab that nbval could not even collect shows as an error of the lab.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

MODES = {"gpus": {}, "shared": {"CUDA_VISIBLE_DEVICES": "0", "DISTLAB_DEVICE": "cuda"}}
NBVAL = ("--nbval", "--nbval-current-env", "--nbval-sanitize-with", "labs/nbval-sanitize.cfg")
_LAB = re.compile(r"(\d\d_\w+)\.ipynb")
_COLOUR = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")  # ANSI colours, as JUnit XML escapes them or not
_WHAT = re.compile(r"Cell \d+: (.+)")


def lab_results(junit_xml: str | Path) -> list[dict]:
    """[{"lab": "01_collectives", "passed": n, "failed": n, "error": n, "skipped": n, "failures": [...]}]
    from the JUnit XML of an nbval run, one row per lab, in the labs' order."""
    labs: dict[str, dict] = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        found = _LAB.search(f"{case.get('classname', '')} {case.get('file', '')} {case.get('name', '')}")
        if found is None:
            continue
        row = labs.setdefault(found[1], {"lab": found[1], "passed": 0, "failed": 0, "error": 0,
                                         "skipped": 0, "failures": []})
        outcome, message = _outcome(case)
        row[outcome] += 1
        if outcome in ("failed", "error"):
            row["failures"].append(f"{case.get('name')}: {message}")
    return [labs[k] for k in sorted(labs)]


def _outcome(case: ET.Element) -> tuple[str, str]:
    """"passed", "failed", "error" or "skipped", and the reason in one line (`reason`)."""
    for tag, outcome in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        child = case.find(tag)
        if child is not None:
            return outcome, reason(child.text or child.get("message") or "")
    return "passed", ""


def reason(text: str) -> str:
    """nbval's report of a cell in one line, colours dropped: what went wrong ("Cell outputs differ",
    "Cell execution caused an exception") and its gist (which output differs; the exception's last line)."""
    lines = [line.strip() for line in _COLOUR.sub("", text).splitlines() if line.strip()]
    what = next((m[1] for line in lines if (m := _WHAT.match(line))), lines[0] if lines else "")
    if "exception" in what:
        return f"{what}: {lines[-1]}"[:300]
    detail = next((line for line in lines if line.startswith("mismatch")), "")
    return f"{what} ({detail})"[:300] if detail else what[:300]


def labs_passed(rows: list[dict]) -> bool:
    """At least one lab ran, and no cell of any lab failed or errored."""
    return bool(rows) and all(r["failed"] == 0 and r["error"] == 0 and r["passed"] > 0 for r in rows)


def run_labs(root: str | Path, mode: str = "gpus", labs: list[str] | None = None,
             timeout: float = 3 * 3600) -> tuple[list[dict], int]:
    """Run the labs (default: every labs/NN_*.ipynb) under nbval in `mode` (see the module docstring);
    each lab's cell counts and pytest's exit status."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not known; use one of {', '.join(MODES)}")
    root = Path(root)
    paths = labs or sorted(str(p.relative_to(root)) for p in (root / "labs").glob("[0-9][0-9]_*.ipynb"))
    with tempfile.TemporaryDirectory(prefix="distlab-gpu-labs-") as tmp:
        xml = Path(tmp) / "labs.xml"
        env = dict(os.environ, DISTLAB_PROGRESS=str(Path(tmp) / "progress.json"), **MODES[mode])
        command = [sys.executable, "-m", "pytest", *NBVAL, *paths, "-p", "no:cacheprovider",
                   f"--junitxml={xml}", "-o", "addopts=", "-q"]
        try:
            status = subprocess.call(command, cwd=root, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            status = -1
        return (lab_results(xml) if xml.is_file() else []), status
