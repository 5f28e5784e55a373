"""Nothing a launch started outlives it: after a clean run, Ctrl-C (once or twice), SIGTERM or SIGKILL of
the launcher, no rank, no process a rank started and no temporary folder is left (checked in /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distlab import launch
from distlab.launch import processes
from tests.launch.test_launch import alive, script, wait_gone


def _start_children() -> list[int]:
    """Start one process in this rank's process group, one in a session of its own, and one in a session
    of its own with an environment of its own (no launch marker), then return."""
    same = subprocess.Popen(["sleep", "30"])
    escaped = subprocess.Popen(["sleep", "31"], start_new_session=True)
    scrubbed = subprocess.Popen(["/bin/sleep", "32"], start_new_session=True, env={})
    return [same.pid, escaped.pid, scrubbed.pid]


def test_processes_started_by_a_rank_end_with_the_run():
    pids = [pid for pair in launch.run(_start_children, 2) for pid in pair]
    assert wait_gone(pids, seconds=3) == []


SLEEPERS = """
    import os, signal, sys, time
    from pathlib import Path
    from distlab import launch

    # Python installs its Ctrl-C handler only when SIGINT is not ignored at start-up; a test runner's worker
    # (pytest-xdist) may hand its children an ignored SIGINT. A kernel always has the handler: so must this.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def sleeper(folder, deaf):
        if deaf:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends this rank
        print(f"rank {launch.rank()} is asleep", flush=True)
        Path(folder, f"{os.getpid()}.pid").touch()
        time.sleep(120)

    try:
        launch.run(sleeper, 2, sys.argv[1], sys.argv[2] == "deaf")
    except KeyboardInterrupt:
        print("the launcher caught KeyboardInterrupt", flush=True)
        time.sleep(60)  # the kernel lives on
"""


def _left_in(tmp: Path) -> list[Path]:
    """What is left in the launcher's TMPDIR, less torch's own per-user cache (torchinductor_USER, made when
    the launcher's fork helper imports torch._dynamo, and reused by every later run, as torch.compile
    reuses it)."""
    return [p for p in tmp.iterdir() if not p.name.startswith("torchinductor_")]


def _start_sleepers(tmp_path: Path, deaf: bool = False) -> tuple[subprocess.Popen, list[int], Path]:
    prog = script(tmp_path, SLEEPERS)
    pids_dir, tmp, out = tmp_path / "pids", tmp_path / "tmp", tmp_path / "out.txt"
    pids_dir.mkdir()
    tmp.mkdir()
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, str(prog), str(pids_dir), "deaf" if deaf else "-"],
                                stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, TMPDIR=str(tmp)))
    deadline = time.monotonic() + 180  # a fresh launcher starts its fork helper first (imports torch)
    while len(list(pids_dir.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.stem) for p in pids_dir.iterdir()]
    assert len(pids) == 2, "the ranks did not start"
    assert len(list(tmp.glob("distlab-*"))) == 1
    return proc, pids, out


def _wait_for(path: Path, text: str, seconds: float = 90) -> str:
    deadline = time.monotonic() + seconds
    while text not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.read_text()


def test_interrupt_shows_the_output_so_far_and_where_each_rank_was(tmp_path):
    proc, pids, out = _start_sleepers(tmp_path)
    proc.send_signal(signal.SIGINT)  # what Jupyter's "interrupt kernel" sends
    text = _wait_for(out, "the launcher caught KeyboardInterrupt")
    proc.kill()
    proc.wait()
    assert wait_gone(pids, seconds=30) == []
    for r in range(2):
        assert f"[rank {r}] rank {r} is asleep" in text
        assert f"  rank {r}: still running, in sleeper, at {tmp_path / 'prog.py'}, line 15: time.sleep(120)" \
            in text
    assert "launch.run was interrupted." in text and "--- where rank 1 was ---" in text


def _asleep() -> None:
    time.sleep(60)


def test_interrupt_as_the_ranks_start_is_reported_and_leaves_no_rank(monkeypatch, capsys):
    """Ctrl-C can land after the ranks are running but before the launcher watches them (it starts a
    thread per rank first, slow on a busy machine): the report must still come, and the ranks still end."""
    pids: list[int] = []

    def start_then_interrupt(*args, **kwargs):
        procs = real_start(*args, **kwargs)
        pids.extend(p.pid for p in procs)
        signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C, as the last rank has started
        return procs

    real_start = processes.start_ranks
    monkeypatch.setattr(processes, "start_ranks", start_then_interrupt)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # xdist's workers may ignore it
    try:
        with pytest.raises(KeyboardInterrupt):
            launch.run(_asleep, 2)
    finally:
        signal.signal(signal.SIGINT, previous)
    out = capsys.readouterr().out
    assert len(pids) == 2 and wait_gone(pids, seconds=10) == []
    assert "launch.run was interrupted." in out, out
    assert "  rank 0: " in out and "  rank 1: " in out, out


def test_second_interrupt_does_not_stop_the_cleanup(tmp_path):
    proc, pids, out = _start_sleepers(tmp_path, deaf=True)  # ending the ranks takes the SIGKILL step
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # an impatient second Ctrl-C, while the ranks are being ended
    _wait_for(out, "the launcher caught KeyboardInterrupt")
    try:
        assert alive(proc.pid)  # the kernel lives on...
        assert wait_gone(pids, seconds=30) == []  # ...and its ranks are gone all the same
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_to_the_launcher_ends_every_rank_and_removes_its_folder(tmp_path):
    proc, pids, out = _start_sleepers(tmp_path)
    proc.terminate()
    assert proc.wait(timeout=30) == -signal.SIGTERM  # it still dies of the signal, after cleaning up
    assert wait_gone(pids) == []
    assert _left_in(tmp_path / "tmp") == []
    text = out.read_text()  # the ranks' output and where they were are not lost
    for r in range(2):
        assert f"[rank {r}] rank {r} is asleep" in text
        assert f"  rank {r}: still running, in sleeper, at " in text
    assert "launch.run was ended by SIGTERM." in text


def test_killed_launcher_leaves_no_rank_and_no_folder_behind(tmp_path):
    proc, pids, _ = _start_sleepers(tmp_path)
    proc.kill()  # a kernel restart: no chance to clean up; the ranks notice their parent is gone
    proc.wait()
    assert wait_gone(pids, seconds=10) == []
    assert _left_in(tmp_path / "tmp") == []


def test_interrupt_before_any_rank_starts_says_so(monkeypatch, capsys):
    """Ctrl-C while the launcher is still getting ready (its fork helper imports torch on a first run)."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(processes, "fork_helper", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch.run(_asleep, 2)
    assert "launch.run was interrupted before any rank had started." in capsys.readouterr().out
