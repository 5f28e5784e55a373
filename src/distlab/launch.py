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
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

DEFAULT_TIMEOUT = 30.0  # seconds a rank may wait in one collective before the run fails
RENDEZVOUS_TIMEOUT = 300.0  # seconds ranks may take to start and meet (importing torch is slow on 2 cores)

# Messages that a rank prints when a *peer* went away: a symptom, not the cause.
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed",
              "ecconnreset", "econnreset", "connection refused")


class RankError(RuntimeError):
    """A rank failed. `rank` is the rank that failed first; `traceback` is that rank's own traceback."""

    def __init__(self, message: str, rank: int, traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback


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


# --------------------------------------------------------------------------------------------------
# Choosing the backend and initialising a rank (shared by `run` and `under_torchrun`)
# --------------------------------------------------------------------------------------------------

def choose_backend(world_size: int, gpus: int, nccl_available: bool) -> str:
    """The "auto" rule: NCCL when torch has it and there is one CUDA GPU per rank, otherwise gloo."""
    return "nccl" if nccl_available and gpus >= world_size else "gloo"


def resolve_backend(backend: str, world_size: int) -> str:
    """Turn "auto" into "nccl" or "gloo" for this machine (`choose_backend`); check a forced choice."""
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend={backend!r} is not known; use 'auto', 'gloo' (CPU) or 'nccl' (GPUs)")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    auto = choose_backend(world_size, gpus, dist.is_nccl_available())
    if backend == "auto":
        return auto
    if backend == "nccl" and auto != "nccl":
        why = "this torch build has no NCCL" if not dist.is_nccl_available() else f"{gpus} are visible"
        raise ValueError(
            f"backend='nccl' needs one CUDA GPU per rank: world_size={world_size} but {why}; "
            "use backend='gloo' to run the ranks on the CPU, or a world_size of at most the GPU count")
    return backend


def _init_rank(backend: str, rank: int, world_size: int, local_rank: int, timeout: float,
               store: dist.Store | None = None) -> None:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    elif "OMP_NUM_THREADS" not in os.environ:
        # Ranks on one CPU share its cores: give each its share so they do not oversubscribe.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    kwargs: dict[str, Any] = {"store": store} if store is not None else {"init_method": "env://"}
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout), **kwargs)


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


def _watch_parent(parent_pid: int) -> None:
    """Exit when the launching process is gone (a killed kernel must not leave ranks behind)."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _worker_main(run_dir: str, rank: int) -> None:
    """Body of one rank process (started by `run` as `python -c`)."""
    import faulthandler

    d = Path(run_dir)
    spec = json.loads((d / "spec.json").read_text())
    threading.Thread(target=_watch_parent, args=(spec["parent_pid"],), daemon=True).start()
    stack_file = open(d / f"rank{rank}.stack", "w")  # noqa: SIM115 (kept open for faulthandler)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=False)
    sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]
    try:
        fn, args, kwargs = cloudpickle.loads((d / "payload.pkl").read_bytes())
        store = dist.TCPStore(spec["host"], spec["port"], spec["world_size"], is_master=False,
                              timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT))
        _init_rank(spec["backend"], rank, spec["world_size"], rank, spec["timeout"], store)
        result = fn(*args, **kwargs)
        try:
            blob = cloudpickle.dumps(result)
        except Exception as e:
            raise TypeError(f"rank {rank} returned a {type(result).__name__}, which cannot be pickled "
                            f"back to the launcher ({e}); return tensors, numbers or plain containers") from e
        (d / f"rank{rank}.tmp").write_bytes(blob)
        os.replace(d / f"rank{rank}.tmp", d / f"rank{rank}.result")
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 (report everything, including SystemExit)
        # Start the traceback at the user's function: the frame of this wrapper is noise to a student.
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        err = {"time": time.time(), "type": type(e).__name__, "message": str(e),
               "traceback": "".join(traceback.format_exception(type(e), e, tb))}
        (d / f"rank{rank}.error").write_text(json.dumps(err))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: no atexit surprises from libraries in a finished rank


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


def _stacks_of(procs: list[subprocess.Popen], d: Path, ranks: list[int]) -> str:
    """Ask still-running ranks where they are (faulthandler on SIGUSR1) and return the stacks."""
    for r in ranks:
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(0.3)
    parts = []
    for r in ranks:
        text = (d / f"rank{r}.stack").read_text(errors="replace").strip()
        parts.append(f"--- where rank {r} was ---\n{text or '(no Python stack)'}")
    return "\n".join(parts)


def _own_error(d: Path, r: int, code: int) -> RankError:
    """Rank r's failure on its own, for a rank that `run(may_fail=...)` allows to fail."""
    f = d / f"rank{r}.error"
    if f.exists():
        e = json.loads(f.read_text())
        return RankError(f"rank {r} failed with {e['type']}: {e['message']}", r, e["traceback"])
    return RankError(f"rank {r} exited with code {code} without raising a Python exception", r)


def _failure(procs: list[subprocess.Popen], d: Path, world_size: int, timeout: float,
             allowed: Collection[int] = ()) -> RankError:
    """Build the error for a failed run: pick the rank whose failure caused the others'."""
    time.sleep(0.2)  # let ranks failing at the same moment finish writing their reports
    errors = {}
    for r in range(world_size):
        f = d / f"rank{r}.error"
        if f.exists() and r not in allowed:
            errors[r] = json.loads(f.read_text())
    exited = {r: p.returncode for r, p in enumerate(procs)
              if p.poll() is not None and p.returncode != 0 and r not in allowed}
    running = [r for r, p in enumerate(procs) if p.poll() is None]

    def symptom(e: dict) -> bool:
        return any(s in e["message"].lower() for s in _PEER_GONE)

    def is_timeout(e: dict) -> bool:
        return "timed out" in e["message"].lower() or "timeout" in e["type"].lower()

    if errors:
        root = min(errors, key=lambda r: (symptom(errors[r]), errors[r]["time"]))
        e = errors[root]
        timed_out = is_timeout(e)
        msg = f"rank {root} failed with {e['type']}: {e['message']}"
        if timed_out:
            msg = (f"rank {root} timed out: it waited more than {timeout:g} s for a message from another "
                   f"rank (run(timeout=...) sets this limit). {e['type']}: {e['message']}")
            if running:
                msg += f"\nRanks still running then: {running}.\n" + _stacks_of(procs, d, running)
        others = sorted(set(errors) - {root})
        if timed_out and not running and all(is_timeout(errors[r]) for r in others):
            msg += ("\nEvery rank timed out waiting: a deadlock. Each rank waits for a message that no "
                    "rank sends; check that every send or collective has a matching recv or collective "
                    "on its peers.")
        elif others:
            msg += f"\n(ranks {others} failed too, afterwards; their errors follow from rank {root}'s)"
        return RankError(f"{msg}\n\n--- traceback of rank {root} ---\n{e['traceback']}", root, e["traceback"])
    root = min(exited)
    code = exited[root]
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return RankError(f"rank {root} {how} without raising a Python exception (a crash, os._exit, or the "
                     "out-of-memory killer); see its output above", root)


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
