"""Start ranks as processes and run one function on every rank.

This is the one way the labs and the tests start a distributed job:

    >>> from distlab import launch
    >>> launch.run(lambda: launch.rank() * 10, world_size=3)
    [0, 10, 20]

`run` starts `world_size` fresh Python processes, joins them into one process group (gloo on CPU, or
NCCL with one GPU per rank), calls the function on each, and hands back what each rank returned, in rank
order. What the ranks print is shown afterwards, grouped by rank. If a rank raises, `run` raises a
`RankError` carrying that rank's own traceback within a second or two, and stops the other ranks.

The same worker code also runs under torchrun on a GPU node, through `under_torchrun`.

How it works, in four steps (each is a function below):
1. The parent opens a `torch.distributed.TCPStore` on a free port: the rendezvous point. Holding the
   port for the whole run is what keeps two launches from colliding.
2. The function and its arguments are serialised with cloudpickle, so a function typed into a notebook
   cell travels by value (spawned processes cannot import a notebook's `__main__`).
3. Each rank is a `python -c` child in its own session: it connects to the store, calls
   `init_process_group`, runs the function, and writes its result (or its traceback) to a file.
4. The parent polls the children. A failed rank ends the run; a rank stuck in a collective is ended by
   the process group's timeout, and the parent reports where the other ranks were stuck at that moment.
   (To study faults, `run(..., may_fail=[r])` lets rank r fail without ending the run.)

The rank's side of steps 2 and 3 lives in `launch_worker.py`; the diagnosis of a failed run in
`launch_diagnosis.py`. Everything is importable from here.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from distlab.launch_diagnosis import RankError as RankError
from distlab.launch_diagnosis import _failure as _failure
from distlab.launch_diagnosis import _own_error as _own_error
from distlab.launch_worker import RENDEZVOUS_TIMEOUT as RENDEZVOUS_TIMEOUT
from distlab.launch_worker import _init_rank as _init_rank
from distlab.launch_worker import _worker_main as _worker_main
from distlab.launch_worker import choose_backend as choose_backend
from distlab.launch_worker import resolve_backend as resolve_backend

DEFAULT_TIMEOUT = 30.0  # seconds a rank may wait in one collective before the run fails


# --------------------------------------------------------------------------------------------------
# Inside a rank
# --------------------------------------------------------------------------------------------------

def _require_group(what: str) -> None:
    if not dist.is_initialized():
        raise RuntimeError(
            f"launch.{what}() needs a process group, and none is initialised in this process: call it "
            "inside a function started by distlab.launch.run(fn, world_size) or under torchrun")


def rank() -> int:
    """This process's rank in the default process group (0 .. world_size - 1)."""
    _require_group("rank")
    return dist.get_rank()


def world_size() -> int:
    """The number of ranks in the default process group."""
    _require_group("world_size")
    return dist.get_world_size()


def local_rank() -> int:
    """This process's index on its machine (torchrun's LOCAL_RANK); it picks the GPU."""
    _require_group("local_rank")
    return int(os.environ.get("LOCAL_RANK", dist.get_rank()))


def backend() -> str:
    """The default group's backend: "gloo" or "nccl"."""
    _require_group("backend")
    return str(dist.get_backend())


def device() -> torch.device:
    """Where this rank's tensors live: its own GPU on NCCL, the CPU on gloo."""
    return torch.device("cuda", local_rank()) if backend() == "nccl" else torch.device("cpu")


def under_torchrun(fn: Callable[..., Any], *args: Any, backend: str = "auto",
                   timeout: float = DEFAULT_TIMEOUT, **kwargs: Any) -> Any:
    """Run `fn(*args, **kwargs)` in a process started by `torchrun --nproc-per-node N ...`.

    torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; this joins the default
    process group from them (env:// initialisation), calls `fn`, and tears the group down again.
    """
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(f"under_torchrun needs torchrun's environment, and {', '.join(missing)} "
                           "is not set: start the program with `torchrun --nproc-per-node N -m <module>`")
    rank_, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank_))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    _init_rank(resolve_backend(backend, local_size), rank_, size, local, timeout)
    try:
        return fn(*args, **kwargs)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------------

def _check_world_size(world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive integer (the number of ranks), "
                         "e.g. run(fn, 4)")
    if world_size > 64:
        raise ValueError(f"world_size={world_size} starts {world_size} processes on one machine; "
                         "use at most 64 (on CPU, 2 to 8 is plenty to see every effect)")
    return world_size


def _kill(procs: list[subprocess.Popen]) -> None:
    """Terminate every rank and whatever it started (each rank leads its own process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 2.0
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.02)
    for p in procs:
        p.wait()


def _print_output(d: Path, world_size: int) -> None:
    """Print what each rank wrote to stdout/stderr, grouped by rank, in rank order."""
    for r in range(world_size):
        f = d / f"rank{r}.out"
        text = f.read_bytes().decode(errors="replace") if f.exists() else ""  # keep \r as written
        for line in text.split("\n"):
            line = line.rsplit("\r", 1)[-1]  # keep what a terminal would show after carriage returns
            if line.strip():
                print(f"[rank {r}] {line}")
    sys.stdout.flush()


def run(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT, may_fail: Collection[int] = (), **kwargs: Any) -> list[Any]:
    """Run `fn(*args, **kwargs)` on `world_size` ranks and return their results, indexed by rank.

    backend: "auto" (NCCL with one GPU per rank if enough CUDA GPUs are visible, else gloo on CPU),
        "gloo" or "nccl".
    timeout: seconds a rank may wait inside one collective or receive before the run fails with a
        `RankError` that says which ranks were still running and where.
    may_fail: ranks allowed to fail, for experiments with faults (a worker that dies): their failure does
        not end the run, and their slot of the returned list holds their `RankError` instead of a result.
    """
    world_size = _check_world_size(world_size)
    allowed = set(may_fail)
    if any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world_size for r in allowed):
        raise ValueError(f"may_fail={list(may_fail)!r} must list ranks from 0 to {world_size - 1}, "
                         "e.g. may_fail=[1]")
    chosen = resolve_backend(backend, world_size)
    if timeout <= 0:
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds, e.g. 30")
    try:
        payload = cloudpickle.dumps((fn, args, kwargs))
    except Exception as e:
        raise TypeError(f"could not send the function and its arguments to the ranks ({e}); they "
                        "travel by cloudpickle: pass tensors, numbers and plain data, not open files or "
                        "locks") from e

    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT))
    with tempfile.TemporaryDirectory(prefix="distlab-") as tmp:
        d = Path(tmp)
        (d / "payload.pkl").write_bytes(payload)
        (d / "spec.json").write_text(json.dumps({
            "host": "127.0.0.1", "port": store.port, "world_size": world_size, "backend": chosen,
            "timeout": timeout, "parent_pid": os.getpid(), "sys_path": [p for p in sys.path if p]}))
        procs: list[subprocess.Popen] = []
        try:
            for r in range(world_size):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world_size), LOCAL_RANK=str(r),
                           LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(store.port), PYTHONUNBUFFERED="1")
                env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
                with open(d / f"rank{r}.out", "w") as out:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-c", f"from distlab.launch import _worker_main; "
                                               f"_worker_main({str(d)!r}, {r})"],
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                        start_new_session=True))
            while True:
                codes = [p.poll() for p in procs]
                if any(c not in (None, 0) and r not in allowed for r, c in enumerate(codes)):
                    error = _failure(procs, d, world_size, timeout, allowed)
                    _kill(procs)
                    _print_output(d, world_size)
                    raise error
                if all(c == 0 or (c is not None and r in allowed) for r, c in enumerate(codes)):
                    break
                time.sleep(0.02)
        finally:
            _kill(procs)  # no-op after a clean finish; on KeyboardInterrupt or an error it stops every rank
            del store
        _print_output(d, world_size)
        failed = {r: _own_error(d, r, procs[r].returncode) for r in allowed if procs[r].returncode != 0}
        missing = [r for r in range(world_size) if r not in failed and not (d / f"rank{r}.result").exists()]
        if missing:
            raise RankError(f"ranks {missing} exited cleanly but left no result (did fn call sys.exit(0)?)",
                            missing[0])
        return [failed[r] if r in failed else cloudpickle.loads((d / f"rank{r}.result").read_bytes())
                for r in range(world_size)]
