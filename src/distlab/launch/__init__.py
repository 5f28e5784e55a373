"""Start ranks as processes and run one function on every rank.

This is the one way the labs and the tests start a distributed job:

    >>> from distlab import launch
    >>> launch.run(lambda: launch.rank() * 10, world_size=3)
    [0, 10, 20]

`run` starts `world_size` fresh Python processes, joins them into one process group (gloo on CPU, or
NCCL with one GPU per rank), calls the function on each, and hands back what each rank returned, in rank
order. What the ranks print is shown afterwards, grouped by rank. If a rank fails, `run` raises a
`RankError` that names the rank that caused it (not the peers that lost their connection to it), with
its traceback and one line per rank saying where it was; `run`'s docstring states the whole contract.
Inside a rank, `rank()`, `world_size()`, `local_rank()`, `backend()` and `device()` describe it
(`devices.py`: the device rule, and DISTLAB_DEVICE=cuda, which puts gloo ranks on shared GPUs). The same
worker code also runs under torchrun on a GPU node, through `under_torchrun`.

How it works, in four steps:
1. The parent opens a `torch.distributed.TCPStore` on a free port: the rendezvous point. Holding the
   port for the whole run is what keeps two launches from colliding.
2. The function and its arguments are serialised with cloudpickle, so a function typed into a notebook
   cell travels by value (spawned processes cannot import a notebook's `__main__`); the cell's source
   travels too, so that tracebacks show its lines (`sources.py`).
3. Each rank is a process in its own session: on Linux it is forked from a helper that imported torch
   once (`zygote.py`: a rank starts in milliseconds instead of seconds), elsewhere (or with
   `DISTLAB_LAUNCH_FORK=0`) a fresh `python -c` child. It connects to the store, calls
   `init_process_group`, runs the function, and writes its result (or its exception) to a file
   (`worker.py`).
4. The parent polls the children (`launcher.py` runs a launch, `processes.py` starts and watches the
   ranks). A failed rank ends the run, and so does a rank still running `timeout` seconds after another
   returned, or a function still running after `deadline` seconds; `observe.py` gathers what is known of
   each rank (a `RankState`, `rank_state.py`), `diagnosis.py` writes the report, `cleanup.py` ends every
   process the launch started, and `results.py` prints the ranks' output and reads their results.
   `arguments.py` checks `run`'s arguments first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from distlab.launch.devices import declared, rank_device, visible_gpus
from distlab.launch.launcher import DEFAULT_DEADLINE, DEFAULT_TIMEOUT, run
from distlab.launch.rank_state import RankError
from distlab.launch.worker import choose_backend, init_rank, resolve_backend

__all__ = ["DEFAULT_DEADLINE", "DEFAULT_TIMEOUT", "RankError", "backend", "choose_backend", "device",
           "local_rank", "rank", "rank_device", "resolve_backend", "run", "under_torchrun", "world_size"]


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
    """Where this rank's tensors live: its own GPU on NCCL; on gloo the CPU, or, with the environment
    variable DISTLAB_DEVICE=cuda, a GPU that several ranks share (`devices.rank_device`)."""
    return rank_device(backend(), local_rank(), visible_gpus(), declared())


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
    init_rank(resolve_backend(backend, local_size), rank_, size, local, timeout)
    try:
        return fn(*args, **kwargs)
    finally:
        dist.destroy_process_group()
