"""The launcher's side of `run`: start the ranks, watch them, stop them, and report what happened.

The ranks are forked by a helper that has imported torch already (`zygote`), or, where forking is
off, `python -c` children (their side is `worker.py` either way); they share a temporary folder with the
launcher, in which each rank writes its output, when its function started, and its result or a
description of its exception. The launcher starts them and polls them every 20 ms (`processes.watch`: a
failure, a rank stuck after another returned, a rank that never comes to init_process_group, the
deadline), asks the ranks still running for their stacks when it has to stop them (SIGUSR1:
faulthandler, `observe`), ends everything (`cleanup.end`), prints the ranks' output grouped by rank and
returns their results (`results.collect`), or raises the report that `diagnosis` writes.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch.distributed as dist

from distlab.launch import arguments, cleanup, diagnosis, observe, processes, results, sources
from distlab.launch.devices import declared, rank_device, visible_gpus
from distlab.launch.processes import LOADING
from distlab.launch.rank_state import RankState
from distlab.launch.worker import RENDEZVOUS_TIMEOUT, resolve_backend

DEFAULT_TIMEOUT = 30.0  # seconds a rank may wait in one collective; also the grace period of a stuck rank
DEFAULT_DEADLINE = 600.0  # seconds the whole run may take: a notebook cell never hangs longer
SETTLE = 1.5  # seconds the other ranks get, after the first failure, to fail too (so the report is complete)


class _Launch:
    """One launch: its folder, its processes, and the marker in their environment."""

    def __init__(self, world_size: int, timeout: float, allowed: set[int]) -> None:
        self.world_size, self.timeout, self.allowed = world_size, timeout, allowed
        self.dir = Path(tempfile.mkdtemp(prefix="distlab-"))
        self.marker = cleanup.marker()
        self.procs: list[subprocess.Popen] = []
        self.seen: dict[int, float] = {}
        self.sources = sources.capture()

    def start(self, payload: bytes, backend: str, port: int) -> None:
        helper = processes.fork_helper()
        (self.dir / "payload.pkl").write_bytes(payload)
        (self.dir / "spec.json").write_text(json.dumps({
            "host": "127.0.0.1", "port": port, "world_size": self.world_size, "backend": backend,
            "timeout": self.timeout, "sys_path": [p for p in sys.path if p], "sources": self.sources,
            # the ranks' parent, whose end means the launcher's end (the helper ends with the launcher)
            "parent_pid": helper.proc.pid if helper is not None else os.getpid()}))
        # A Ctrl-C in here would leave the helper mid-reply and the ranks unlisted: it waits for the end.
        with cleanup.shielded(keep_interrupt=True):
            self.procs = processes.start_ranks(self.dir, self.world_size, port, self.marker, helper)
            for r, p in enumerate(self.procs):
                threading.Thread(target=processes.wait_for_exit, args=(p, r, self.seen), daemon=True).start()

    def stop(self, settle: float = 0.0) -> list[RankState]:
        """Let the other ranks settle, record every rank's state, end them all, print their output."""
        with cleanup.shielded():
            processes.settle(self.procs, self.seen, settle)
            states = observe.states(self.procs, self.dir, self.allowed, self.seen, self.sources)
            cleanup.end(self.procs, self.marker, observe.noted(self.dir))
        results.print_output(self.dir, self.world_size)
        return states

    def close(self) -> None:
        with cleanup.shielded():
            cleanup.end(self.procs, self.marker, observe.noted(self.dir))
            shutil.rmtree(self.dir, ignore_errors=True)


def _outcome(launch: _Launch, payload: bytes, backend: str, port: int, deadline: float | None) -> str:
    """Start the ranks and say how the run ended. On Ctrl-C or SIGTERM, from the moment the ranks start
    (the ranks may be running before the watching begins), print the output so far and where each rank
    was first."""
    try:
        launch.start(payload, backend, port)
        return processes.watch(launch.procs, launch.dir, launch.allowed, launch.timeout, launch.seen,
                               deadline)
    except (KeyboardInterrupt, cleanup.Terminated) as e:
        how = "interrupted" if isinstance(e, KeyboardInterrupt) else "ended by SIGTERM"
        print(diagnosis.interrupted(launch.stop(), launch.timeout, how), flush=True)
        raise


def _launch(payload: bytes, world_size: int, backend: str, timeout: float, deadline: float | None,
            allowed: set[int]) -> list[Any]:
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT))
    launch = _Launch(world_size, timeout, allowed)
    try:
        outcome = _outcome(launch, payload, backend, store.port, deadline)
        states = launch.stop(SETTLE if outcome == "failed" else 0.0)
        if outcome == "failed":
            raise diagnosis.failure(states, timeout)
        if outcome == "absent":
            raise diagnosis.never_joined(states, max(timeout, LOADING))
        running = any(s.code is None and not s.allowed for s in states)
        if outcome in ("deadline", "start-up") and running:
            limit = f"its deadline of {deadline:g} s" if outcome == "deadline" else \
                f"the start-up limit of {RENDEZVOUS_TIMEOUT:g} s"
            raise diagnosis.past_deadline(states, limit, timeout)
        if running:
            raise diagnosis.stuck(states, timeout, timeout)
        why = f"when the run reached its deadline of {deadline:g} s" if outcome == "deadline" else \
            f"{timeout:g} s after the other ranks finished"  # (start-up ends with a running rank: raised)
        return results.collect(states, launch.dir, why)
    finally:
        launch.close()
        del store


def run(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT, deadline: float | None = DEFAULT_DEADLINE,
        may_fail: Collection[int] = (), **kwargs: Any) -> list[Any]:
    """Run `fn(*args, **kwargs)` on `world_size` ranks and return their results, indexed by rank.

    backend: "auto" (NCCL with one GPU per rank if enough CUDA GPUs are visible, else gloo on CPU),
        "gloo" or "nccl". Inside a rank `launch.device()` says where its tensors belong; gloo ranks use
        the CPU unless the environment says DISTLAB_DEVICE=cuda (ranks share GPUs, `devices.py`).
    timeout: seconds a rank may wait inside one collective or receive (and at start-up, for the others
        to join) before it fails; also the grace period of the other ranks once one rank has returned.
        At least 1 s.
    deadline: seconds the function may run on the ranks (default 600), or None for no limit. The start-up
        before it (starting the processes, importing, joining the group) is limited to 300 s.
    may_fail: ranks allowed to fail, for experiments with faults (a worker that dies): their failure does
        not end the run, and their slot of the returned list holds their `RankError` instead of a result.

    The contract:
    - What the ranks print is printed after the run, grouped by rank ("[rank 1] ..."), in every case
      (an error, Ctrl-C, a SIGTERM to the launcher, the deadline).
    - If a rank not in `may_fail` fails, `run` raises a `RankError` within about three seconds (a rank
      waiting in a collective for a peer that is alive but silent fails when its `timeout` ends). The
      report names the cause, whichever way the failure surfaced (in a collective, in `Work.wait()`, in
      a chapter's own error): the first rank that raised (with its traceback), or that died without an
      exception (os._exit, even os._exit(0), or a signal: its name, what it usually means, native
      code's last words and where the rank was); if the others timed out waiting for a rank that is
      still computing, sleeping or starting, that rank. The other ranks' errors are marked as
      consequences. One line per rank says what it did and at which line of the code. If the ranks
      timed out waiting for each other, the report says it is a deadlock; if a peer returned normally
      while a rank still waited for it, it says that.
    - A rank stuck outside communication (an endless loop, a long sleep) is bounded too: once a rank has
      returned, every other rank must finish within `timeout` seconds. Then the launcher ends it and
      raises a `RankError` with its Python stack; a stuck rank in `may_fail` gets a `RankError` in its
      slot instead.
    - No function runs longer than `deadline` seconds, even when every rank loops outside communication,
      and no start-up takes longer than 300 s: then the launcher ends the run and raises a `RankError`
      with every running rank's Python stack. A rank that takes 10 s (or `timeout`, if longer) more than
      the others to load its function (its imports hang) is reported as the cause.
    - On Ctrl-C (KeyboardInterrupt) or a SIGTERM the output so far and where each rank was are printed
      before the interrupt propagates; a second Ctrl-C does not stop the cleanup.
    - Afterwards nothing the launch started is left: the ranks, the processes they started (even in a
      session of their own, with an environment of their own) and the temporary folder are gone, also
      after a SIGTERM to the launcher, and within about a second if the launcher is killed outright.
    """
    arguments.check_fn(fn)
    world_size = arguments.check_world_size(world_size)
    allowed = arguments.check_may_fail(may_fail, world_size)
    timeout = arguments.check_timeout(timeout)
    deadline = arguments.check_deadline(deadline)
    chosen = resolve_backend(backend, world_size)
    rank_device(chosen, world_size - 1, visible_gpus(), declared())  # a bad DISTLAB_DEVICE fails here, named
    try:
        payload = sources.dumps((fn, args, kwargs))
    except Exception as e:
        raise TypeError(f"could not send the function and its arguments to the ranks ({e}); they "
                        "travel by cloudpickle: pass tensors, numbers and plain data, not open files or "
                        "locks") from e
    with cleanup.sigterm_raises():
        try:
            return _launch(payload, world_size, chosen, timeout, deadline, allowed)
        except cleanup.Terminated:
            pass
    signal.raise_signal(signal.SIGTERM)  # everything is cleaned up: now end as SIGTERM would have
    raise SystemExit(128 + signal.SIGTERM)
