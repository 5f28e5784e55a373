"""The write guard in a fresh Python, as the grader installs it (`sitecustomize`): writes outside the
folder, a signal to the grader and another program are refused and logged; the folder stays writable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from distlab.grading import guard

ATTEMPTS = """
import os, subprocess, sys
results = []
for name, attempt in [
    ("outside", lambda: open(sys.argv[1], "w")),
    ("rename", lambda: os.rename("inside.txt", sys.argv[1])),
    ("signal", lambda: os.kill(int(os.environ["DISTLAB_GRADE_ENGINE"]), 0)),
    ("program", lambda: subprocess.run(["touch", sys.argv[1]])),
]:
    try:
        attempt()
        results.append(name + " allowed")
    except PermissionError:
        results.append(name + " refused")
print(",".join(results))
"""


def test_a_guarded_python_may_write_only_inside_its_folder(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside.txt"
    (root / "site").mkdir(parents=True)
    shutil.copyfile(guard.__file__, root / "site" / "sitecustomize.py")
    (root / "inside.txt").write_text("mine")
    env = {**os.environ, guard.ROOT_ENV: str(root), guard.PROTECT_ENV: str(os.getpid()),
           "PYTHONPATH": str(root / "site")}
    run = subprocess.run([sys.executable, "-c", ATTEMPTS, str(outside)], cwd=root, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    assert run.stdout.strip() == "outside refused,rename refused,signal refused,program refused", run.stderr
    assert not outside.exists() and (root / "inside.txt").read_text() == "mine"
    log = (root / guard.LOG_NAME).read_text().splitlines()
    assert len(log) == 4 and log[0] == f"writing to {outside}"
