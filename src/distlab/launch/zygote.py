"""Start ranks in milliseconds: fork them from a process that has already imported torch (Linux only).

Importing torch costs a rank about 3 s of CPU; a lab launches dozens of runs of 2-4 ranks, and on a
two-core laptop that start-up is most of its time. Like Python's `forkserver` (and Android's "zygote",
after which it is named), `Zygote` starts one helper process per launching process, the first time one
is needed. The helper imports torch once and then forks a fresh child for every rank it is asked for.
The child becomes what `python -c "... _worker_main(dir, r)"` would have been:

- a session and process group of its own (`os.setsid`, as `start_new_session=True` gives),
- stdin from /dev/null, stdout and stderr into the rank's output file,
- the launch's environment (the marker that `cleanup` looks for included) and working directory;
  the variables that libraries read once, at import (`OMP_NUM_THREADS`, ...), are the helper's: a
  launch whose values differ gets a new helper (`helper`),
- the launcher's `sys.path`, and the course's own modules imported afresh: the helper never imports
  `distlab`, so a student who edits the package sees the edit in the next run, as with `python -c`.

The helper reaps its children and tells the launcher each exit status (`ForkedRank.poll` and `wait`
read it, as `subprocess.Popen`'s do). It ends when the launching process does: its stdin is a pipe from
the launcher, and the end of that pipe is the end of the launcher. A rank notices that its parent (the
helper) is gone and cleans up, as it does when a launcher dies (`worker._watch_parent`).

`DISTLAB_LAUNCH_FORK=0` turns this off (every rank is a fresh `python -c`, as on macOS and Windows,
where forking a process that has loaded torch is not safe).

This file is run as a script by the helper, so it imports nothing from `distlab`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

# What the helper imports once: what every rank imports before its function runs, and what the course's
# code imports often and slowly. torch._dynamo is imported the first time a TorchDispatchMode is entered
# (distlab.comm_log): seconds of CPU that every rank recording its communication would pay again.
PRELOAD = ("torch", "torch.distributed", "cloudpickle", "torch._dynamo", "torch.distributed.tensor",
           "torch.distributed.fsdp", "torch.distributed.pipelining")


def _serve() -> None:
    """The helper's loop: read one JSON request per line from stdin, fork, report pids and exits."""
    del sys.path[0]  # this script's folder (launch/) must not shadow top-level module names
    for name in PRELOAD:
        __import__(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    reply, lock, forked = sys.stdout.fileno(), threading.Lock(), threading.Event()

    def say(line: str) -> None:
        with lock:
            os.write(reply, (line + "\n").encode())  # raw writes: no Python buffer a fork could copy locked

    threading.Thread(target=_reap, args=(say, forked), daemon=True).start()
    for raw in sys.stdin.buffer:
        request = json.loads(raw)
        pid = os.fork()
        if pid == 0:
            _become_rank(request)  # never returns
        say(f"pid {request['id']} {pid}")
        forked.set()
    os._exit(0)  # the launcher is gone; its ranks notice that their parent is gone too


def _reap(say, forked: threading.Event) -> None:
    """Wait for every child and report "exit PID CODE" (CODE as Popen's returncode: -N for signal N)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            forked.wait()
            forked.clear()
            continue
        say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def _become_rank(request: dict) -> None:
    """In the forked child: take the rank's session, files, environment and modules, then run it."""
    code = 1
    try:
        os.setsid()
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
        # as in a fresh Python: Ctrl-C raises KeyboardInterrupt, SIGTERM and SIGUSR1 kill (until the worker
        # installs its handlers); SIGPIPE stays ignored (Python's start-up ignores it, so a write to a
        # closed socket raises BrokenPipeError, which gloo's peers report, instead of killing the rank)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["sys_path"]
        sys.argv[:] = ["-c"]
        from distlab.launch.worker import _worker_main

        _worker_main(request["run_dir"], request["rank"])  # ends the process itself (os._exit)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


class ForkedRank:
    """A rank forked by the helper, with the part of `subprocess.Popen`'s interface the launcher uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self.zygote.exit_code(self.pid, wait=True, timeout=timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0)
        self.returncode = code
        return code


class Zygote:
    """The launching process's helper (see the module's docstring); `start` forks one rank."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTLAB_LAUNCH_")}
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # read by torch's C++ at import, in the helper
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        self.environment = _import_environment()
        self.cond = threading.Condition()
        self.pids: dict[int, int] = {}  # request id -> pid
        self.exits: dict[int, int] = {}  # pid -> exit code
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, a, b = line.decode().split()
            with self.cond:
                if kind == "pid":
                    self.pids[int(a)] = int(b)
                else:
                    self.exits[int(a)] = int(b)
                self.cond.notify_all()
        with self.cond:  # the helper died: nothing more will be reported
            self.cond.notify_all()

    def start(self, run_dir: Path, rank: int, env: dict[str, str], out: Path,
              timeout: float = 300.0) -> ForkedRank:
        """Fork rank `rank` of the run in `run_dir`; its output goes to `out`."""
        with self.cond:
            request_id, self.next_id = self.next_id, self.next_id + 1
        request = {"id": request_id, "run_dir": str(run_dir), "rank": rank, "env": env, "out": str(out),
                   "cwd": os.getcwd(), "sys_path": [p for p in sys.path if p]}
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        with self.cond:
            if not self.cond.wait_for(lambda: request_id in self.pids or not self.alive(), timeout):
                raise RuntimeError("the launcher's fork helper did not answer within "
                                   f"{timeout:g} s; set DISTLAB_LAUNCH_FORK=0 to start ranks with python -c")
            if request_id not in self.pids:
                raise RuntimeError("the launcher's fork helper died; set DISTLAB_LAUNCH_FORK=0 to start "
                                   "ranks with python -c")
            return ForkedRank(self, self.pids.pop(request_id))

    def exit_code(self, pid: int, wait: bool = False, timeout: float | None = None) -> int | None:
        with self.cond:
            if wait:
                self.cond.wait_for(lambda: pid in self.exits or not self.alive(), timeout)
            if pid not in self.exits and not self.alive():
                return -signal.SIGKILL  # the helper died with its children unreported
            return self.exits.get(pid)

    def close(self) -> None:
        """End the helper (its ranks, if any still run, notice and end themselves)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# Variables a library reads once, at import, in the helper: a change in them needs a new helper.
IMPORT_TIME = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES",
               "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES")


def _import_environment() -> tuple[tuple[str, str | None], ...]:
    return tuple((k, os.environ.get(k)) for k in IMPORT_TIME)


def usable() -> bool:
    """Forking is on: Linux, and not turned off by DISTLAB_LAUNCH_FORK=0."""
    return sys.platform.startswith("linux") and os.environ.get("DISTLAB_LAUNCH_FORK", "1") != "0"


_helpers: dict[int, Zygote] = {}  # this process's helper (by pid: a forked launcher needs its own)


def helper() -> Zygote:
    """This process's helper, started on first use, and again if it died or an import-time variable
    changed since it started."""
    current = _helpers.get(os.getpid())
    if current is not None and current.alive() and current.environment == _import_environment():
        return current
    if current is not None:
        current.close()
    _helpers[os.getpid()] = Zygote()
    return _helpers[os.getpid()]


if __name__ == "__main__":
    _serve()
