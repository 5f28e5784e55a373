"""The faults a replica run scripts (`replicas.ReplicaConfig`): a kill, a join and a pause, each at the same
step on every run however the machine schedules the processes.

- `kill = (replica, step)`: that replica SIGKILLs itself after its backward at that step (the others are
  waiting for it in the all-reduce); the time goes to the store, for the detection time.
- `join = (replica, step)`: that slot waits until the quorum's source has published `step` steps
  (`wait_for_progress`), then checks in; the others wait for its check-in at that step.
- `pause = (replica, step, seconds)`: that replica stops (SIGSTOP: every thread, its heartbeat too) after
  its all-reduce at that step, before its vote, and a helper process wakes it (SIGCONT) after `seconds`:
  a stalled host. The others wait for its check-in one step later.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Protocol

import torch.distributed as dist


class Script(Protocol):
    """What a run scripts (`replicas.ReplicaConfig` is one): the events, and how long a join is waited for.
    A protocol, so that this file need not import `replicas`, which imports it."""

    kill: tuple[int, int] | None
    join: tuple[int, int] | None
    pause: tuple[int, int, float] | None
    join_timeout: float


def wait_for_progress(store: dist.Store, steps: int) -> None:
    """Block until the quorum's source has published that `steps` steps are done."""
    while int(store.add("progress", 0)) < steps:
        time.sleep(0.005)


def wait_for_scripted(c: Script, me: int, step: int, store: dist.Store, round_: int,
                      expected: tuple[int, ...]) -> None:
    """The scripted joins land at the same step on every run: at config.join's step the others wait for
    the newcomer to check in, and one step after config.pause's the others wait for the paused replica."""
    for event, at in ((c.join, 0), (c.pause, 1)):
        if event and event[0] != me and step == event[1] + at and event[0] not in expected:
            wait_for_check_in(store, round_, event[0], c.join_timeout)


def wait_for_check_in(store: dist.Store, round_: int, replica: int, timeout: float) -> None:
    """The scripted join point (module docstring): wait until `replica` has checked in at `round_`, or
    `timeout` seconds; then the round goes on as usual, with or without it."""
    start = time.monotonic()
    while not store.check([f"r{round_}/in/{replica}"]) and time.monotonic() - start < timeout:
        time.sleep(0.005)


def kill_if_due(c: Script, me: int, step: int, store: dist.Store) -> None:
    """config.kill's replica dies at its step, after its backward (the time goes to the store)."""
    if c.kill == (me, step):
        store.set("killed_at", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)  # mid-step: the others wait for it in the all-reduce


def pause_if_due(c: Script, me: int, step: int, store: dist.Store) -> None:
    """config.pause's replica stops (SIGSTOP: every thread, its heartbeat too) after its all-reduce at its
    step, the first time it gets there, and a helper wakes it (SIGCONT) after the given seconds."""
    if c.pause is None or c.pause[:2] != (me, step) or store.add(f"paused/{me}", 1) > 1:
        return
    waker = subprocess.Popen(["sh", "-c", f"sleep {float(c.pause[2])!r}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)  # returns once the waker's SIGCONT arrives
    waker.wait()
