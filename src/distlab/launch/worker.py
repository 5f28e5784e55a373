"""Inside one rank process started by `distlab.launch.run`: choose the backend, join the group, run fn.

`run` starts each rank as `python -c "from distlab.launch.worker import _worker_main; _worker_main(dir, r)"`;
`_worker_main` reads the run's spec and payload from `dir`, connects to the parent's TCPStore, calls
`init_process_group` (through `init_rank`, which `under_torchrun` shares), runs the function, and writes
its result, or a description of its exception (`describe`), back into `dir` for the parent to read. It
also marks when the function started, answers SIGUSR1 with a dump of its Python stacks (faulthandler),
and ends itself, everything it started and the run's folder when the launching process is gone. The
backend rule lives here too, since both ways of starting a rank use it.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from distlab.launch import cleanup
from distlab.launch.devices import declared, rank_device, visible_gpus
from distlab.launch.sources import TORCH_DIST, Frame, register, rename_cells, where

RENDEZVOUS_TIMEOUT = 300.0  # seconds ranks may take to start and meet (importing torch is slow on 2 cores)

# What a rank's error says when a *peer* went away: a symptom, not the cause.
PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed",
             "econnreset", "connection refused", "communicator was aborted", "remote process exited",
             "pair closure")
_NATIVE = re.compile(r"\[[^\]]*(gloo|c10d|nccl)[^\]]*\.(cc|cpp|h|hpp):\d+\]", re.IGNORECASE)


def choose_backend(world_size: int, gpus: int, nccl_available: bool) -> str:
    """The "auto" rule: NCCL when torch has it and there is one CUDA GPU per rank, otherwise gloo."""
    return "nccl" if nccl_available and gpus >= world_size else "gloo"


def resolve_backend(backend: str, world_size: int) -> str:
    """Turn "auto" into "nccl" or "gloo" for this machine (`choose_backend`); check a forced choice."""
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend={backend!r} is not known; use 'auto', 'gloo' (CPU) or 'nccl' (GPUs)")
    gpus = visible_gpus()
    auto = choose_backend(world_size, gpus, dist.is_nccl_available())
    if backend == "auto":
        return auto
    if backend == "nccl" and auto != "nccl":
        why = "this torch build has no NCCL" if not dist.is_nccl_available() else f"{gpus} are visible"
        raise ValueError(
            f"backend='nccl' needs one CUDA GPU per rank: world_size={world_size} but {why}; "
            "use backend='gloo' to run the ranks on the CPU, or a world_size of at most the GPU count")
    return backend


def init_rank(backend: str, rank: int, world_size: int, local_rank: int, timeout: float,
              store: dist.Store | None = None) -> None:
    """Join the default process group (NCCL: first pick this rank's GPU; gloo: share the CPU's cores, or
    with DISTLAB_DEVICE=cuda make the shared GPU this rank's current device)."""
    dev = rank_device(backend, local_rank, visible_gpus(), declared())
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if backend == "gloo" and "OMP_NUM_THREADS" not in os.environ:
        # Ranks on one CPU share its cores: give each its share so they do not oversubscribe.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    kwargs: dict[str, Any] = {"store": store} if store is not None else {"init_method": "env://"}
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout), **kwargs)


def _wait_for_arrivals(store: dist.Store, rank: int, world_size: int) -> None:
    """Return once every rank has loaded its function and is about to call `init_process_group`.

    Ranks start at different speeds (importing torch takes seconds on a busy machine), and gloo counts
    the run's `timeout` in `init_process_group` from each rank's own arrival: without this wait, a small
    timeout would end a run before it began. A rank that never arrives (its arguments' unpickling hangs)
    is found by the launcher, which watches the `joining` files (`processes.watch`)."""
    store.set(f"arrived/{rank}", "1")
    store.wait([f"arrived/{r}" for r in range(world_size)])


def _wait_for_everyone(store: dist.Store, rank: int, world_size: int) -> None:
    """Return once every rank has joined the process group.

    gloo connects each pair of ranks inside `init_process_group`, and a rank returns from it as soon as its
    own connections are up. A rank whose function ends at once (it raises, or exits) could otherwise leave
    while a peer is still connecting, and that peer would fail inside `init_process_group` with a lost
    connection instead of running its function.
    """
    store.set(f"joined/{rank}", "1")
    store.wait([f"joined/{r}" for r in range(world_size)])


def _message(e: BaseException) -> tuple[str | None, str]:
    """The exception's message, or None and why it could not be printed (its __str__ raised)."""
    try:
        return str(e), ""
    except Exception as inner:  # a broken __str__ must not hide the exception itself
        return None, f"its __str__ raised {type(inner).__name__}"


def _from_torch_distributed(e: BaseException, message: str) -> bool:
    """Whether torch.distributed raised e: a `DistError`, an error raised in its Python code, or one that
    its C++ raised through `Work.wait()` (whose innermost Python frame is the caller's: gloo's
    messages start with their source file, "[.../gloo/transport/tcp/pair.cc:537] ...")."""
    frames = traceback.extract_tb(e.__traceback__)
    return (isinstance(e, dist.DistError) or bool(frames and TORCH_DIST in frames[-1].filename)
            or bool(_NATIVE.search(message)))


def _symptom(e: BaseException) -> str:
    """"timeout", "peer" or "raised": the kind of e, or of the exception it was raised from or while
    handling (a chapter that wraps a lost connection in its own error still reports a symptom)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        message = (_message(e)[0] or "")
        text = message.lower()
        if _from_torch_distributed(e, message):
            if "timed out" in text or "timeout" in text or "timeout" in type(e).__name__.lower():
                return "timeout"
            if any(s in text for s in PEER_GONE):
                return "peer"
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return "raised"


def describe(e: BaseException, sources: dict[str, dict]) -> dict:
    """What the parent needs to know about a rank's exception, as JSON.

    `kind` tells a symptom from a cause by where the exception comes from, not by its words:
    "timeout" and "peer" (the connection to a peer broke) are raised by `torch.distributed` (in its
    Python code, or its C++ through `Work.wait()`), also when wrapped in another exception; anything
    else, including a student's own exception that says "timed out", is "raised"."""
    tb = e.__traceback__.tb_next if e.__traceback__ is not None else None  # start at the user's function
    frames = [Frame(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(tb)]
    message, unprintable = _message(e)
    kind = _symptom(e)
    return {"time": time.time(), "type": type(e).__qualname__, "message": message,
            "unprintable": unprintable, "kind": kind, "where": where(frames, sources),
            "traceback": rename_cells("".join(traceback.format_exception(type(e), e, tb)), sources)}


def _watch_parent(parent_pid: int, run_dir: Path) -> None:
    """When the launching process is gone (a killed kernel), end this rank, what it started, and the run."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    shutil.rmtree(run_dir, ignore_errors=True)
    cleanup.kill_all(cleanup.descendants([os.getpid()]))  # also those in a session of their own
    os.killpg(0, signal.SIGKILL)  # this rank leads its own process group: it and its children


def _listen(d: Path, rank: int) -> list:
    """Answer SIGUSR1 with a dump of every thread's stack, and a fatal signal (SIGSEGV, SIGABRT...) with
    the same, into files the launcher reads. The stack file appears only once the handler is in place,
    so the launcher never sends SIGUSR1 (which would kill the process) too early."""
    fatal = open(d / f"rank{rank}.fatal", "w")  # kept open for faulthandler, like the stack file
    faulthandler.enable(file=fatal, all_threads=True)
    stack_file = open(d / f"rank{rank}.stack.tmp", "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    os.replace(d / f"rank{rank}.stack.tmp", d / f"rank{rank}.stack")
    return [fatal, stack_file]  # the caller keeps them open: closing them would silence faulthandler


def _record_children(d: Path, rank: int) -> None:
    """Before this rank exits, note every process it started and that still runs, for `cleanup.end`."""
    found = cleanup.descendants([os.getpid()])
    (d / f"rank{rank}.children").write_text("".join(f"{pid} {start}\n" for pid, start in found))


def _result_bytes(result: Any, rank: int) -> bytes:
    try:
        return cloudpickle.dumps(result)
    except Exception as e:
        raise TypeError(f"rank {rank} returned a {type(result).__name__}, which cannot be pickled "
                        f"back to the launcher ({e}); return tensors, numbers or plain containers") from e


def _worker_main(run_dir: str, rank: int) -> None:
    """Body of one rank process (started by `run` as `python -c`)."""
    d = Path(run_dir)
    spec = json.loads((d / "spec.json").read_text())
    threading.Thread(target=_watch_parent, args=(spec["parent_pid"], d), daemon=True).start()
    listening = _listen(d, rank)  # noqa: F841 (kept open until the process exits)
    cleanup.adopt_orphans()
    sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]
    register(spec["sources"])
    try:
        fn, args, kwargs = cloudpickle.loads((d / "payload.pkl").read_bytes())
        (d / f"rank{rank}.joining").touch()
        store = dist.TCPStore(spec["host"], spec["port"], spec["world_size"], is_master=False,
                              timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT))
        _wait_for_arrivals(store, rank, spec["world_size"])
        init_rank(spec["backend"], rank, spec["world_size"], rank, spec["timeout"], store)
        _wait_for_everyone(store, rank, spec["world_size"])
        (d / f"rank{rank}.started").touch()
        blob = _result_bytes(fn(*args, **kwargs), rank)
        (d / f"rank{rank}.tmp").write_bytes(blob)
        os.replace(d / f"rank{rank}.tmp", d / f"rank{rank}.result")
        if dist.is_initialized():  # the function may have destroyed it itself, as torchrun scripts end
            _collect_garbage_here()
            dist.destroy_process_group()
    except BaseException as e:  # report everything, including SystemExit
        (d / f"rank{rank}.err.tmp").write_text(json.dumps(describe(e, spec["sources"])))
        os.replace(d / f"rank{rank}.err.tmp", d / f"rank{rank}.error")  # whole, or not at all
        _exit(d, rank, 1)
    _exit(d, rank, 0)


def _collect_garbage_here() -> None:
    """Free cyclic garbage on this (the main) thread and stop the collector, before the groups go.

    A gloo group's destructor joins its worker threads, so it must not run on one of them. It could: a
    DDP communication hook's Python callback runs on a gloo worker, Python's cyclic collector may run
    inside it and free the last DDP module that holds a group once `destroy_process_group` has cleared
    the table, and the thread then joins itself (`std::system_error` "Resource deadlock avoided",
    SIGABRT; seen once in a fresh clone's `make test`, after chapter 7's PowerSGD comparison returned).
    Here the garbage drops its references while the table still holds every group, and with the
    collector off no worker thread collects during the teardown; `os._exit` follows."""
    gc.collect()
    gc.disable()


def _exit(d: Path, rank: int, code: int) -> None:
    """Leave without interpreter teardown (no atexit surprises from libraries in a finished rank)."""
    _record_children(d, rank)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:  # the function may have replaced or closed them (sys.stdout = None): its result still counts
            stream.flush()  # type: ignore[union-attr]
        except Exception:
            pass
    os._exit(code)
