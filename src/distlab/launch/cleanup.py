"""Ending everything a launch started, whatever happens to the launcher meanwhile.

- Each rank leads its own session and process group (`start_new_session`), which also holds what the
  rank starts: `end` signals the group even after the rank itself has exited, so a `sleep` it started
  does not outlive it.
- A process that a rank starts in a session of its own leaves that group. It still inherits the rank's
  environment, which carries a variable unique to the launch (`marker`); `end` also ends every process
  whose environment has it (read from /proc, so no cgroups and no extra dependency).
- A process started in a session of its own *and* with an environment of its own is still a descendant
  of its rank: a rank adopts the orphans among its descendants (`adopt_orphans`, Linux's child
  subreaper), so they stay in its process tree; `end` ends the tree of every rank still running, and a
  rank that exits notes the processes of its tree (`descendants`) for `end` to end with the run. (Only a
  rank killed outright, before it could note them, leaves such a process to init.)
- `shielded`: while the ranks are being ended, a second Ctrl-C is ignored (it would abort the cleanup
  and leave ranks running for as long as the kernel lives), and a SIGTERM waits until the end.
- `sigterm_raises`: a SIGTERM to the launcher becomes an exception, so that the cleanup runs (ranks
  ended, temporary folder removed) before the process dies of the signal as it would have.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(BaseException):
    """The launcher received SIGTERM while ranks were running (see `sigterm_raises`)."""


def marker() -> str:
    """A fresh environment variable name that marks every process of one launch."""
    return f"DISTLAB_LAUNCH_{uuid.uuid4().hex}"


def _marked(name: str) -> list[int]:
    """Live processes whose environment holds the launch's marker (a zombie's environment reads empty)."""
    needle, found = f"{name}=".encode(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for pid in entries:
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, from /proc/PID/stat."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[1]), int(fields[19])) if fields[0] != "Z" else None


def descendants(pids: list[int]) -> list[tuple[int, int]]:
    """Every live process below `pids` in the process tree, as (pid, start time) pairs."""
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    stats = {pid: st for pid in entries if (st := _stat(pid)) is not None}
    found: list[tuple[int, int]] = []
    frontier = set(pids)
    while frontier:
        children = {pid for pid, (ppid, _) in stats.items() if ppid in frontier} - {p for p, _ in found}
        found += [(pid, stats[pid][1]) for pid in children]
        frontier = children
    return found


def adopt_orphans() -> None:
    """Make this process the child subreaper of its descendants (Linux; elsewhere nothing happens)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def kill_all(processes: list[tuple[int, int]], sig: int = signal.SIGKILL) -> None:
    """Signal each (pid, start time) that still names the same process (a pid can be reused)."""
    for pid, start in processes:
        st = _stat(pid)
        if st is not None and st[1] == start:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _signal_all(procs: list[subprocess.Popen], name: str, sig: int) -> None:
    targets = [(os.killpg, p.pid) for p in procs] + [(os.kill, pid) for pid in _marked(name)]
    for kill, pid in targets:
        try:
            kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait(procs: list[subprocess.Popen], name: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (any(p.poll() is None for p in procs) or _marked(name)):
        time.sleep(0.02)


def end(procs: list[subprocess.Popen], name: str, noted: list[tuple[int, int]] = ()) -> None:
    """End every rank, its process group, its process tree, the processes it `noted` on exit and every
    process marked with `name`: SIGTERM, then SIGKILL."""
    tree = descendants([p.pid for p in procs if p.poll() is None]) + list(noted)
    _signal_all(procs, name, signal.SIGTERM)
    kill_all(tree, signal.SIGTERM)
    _wait(procs, name, 1.0)
    _signal_all(procs, name, signal.SIGKILL)
    kill_all(tree + descendants([p.pid for p in procs if p.poll() is None]))
    for p in procs:
        p.wait()
    _wait(procs, name, 2.0)


@contextmanager
def shielded(keep_interrupt: bool = False) -> Iterator[None]:
    """Hold off Ctrl-C and SIGTERM. SIGTERM is delivered on exit; Ctrl-C is dropped (the run is being
    stopped anyway), or, with `keep_interrupt`, delivered on exit too (KeyboardInterrupt is raised there)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals are only ever handled in the main thread
        return
    pending: list[int] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    mine = [s for s, h in previous.items() if h is not None]  # None: a handler set outside Python
    for s in mine:
        signal.signal(s, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for s in mine:
            signal.signal(s, previous[s])
        if signal.SIGTERM in pending:
            signal.raise_signal(signal.SIGTERM)
        if keep_interrupt and signal.SIGINT in pending:
            signal.raise_signal(signal.SIGINT)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into `Terminated` while the launch runs, if nobody else handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
