"""A parameter server on torch.distributed point-to-point messages: one server, W workers, three modes.

Rank 0 is the server and holds the parameters; ranks 1..W are workers (Dean et al. 2012, sec. 4.1; Li et
al. 2014, sec. 3). Each worker loops: receive the current parameters (PARAMS), compute a gradient on its
shard of the batch of its clock, push it (PUSH). The server applies each push and decides when to send a
worker its next parameters. That decision is the consistency mode (`distlab.async_sgd.ssp`):

- "sync": the server collects one gradient from every worker, applies their average once, then releases
  everyone: synchronous SGD, equal to single-process SGD on the whole global batch;
- "async": every push is applied as it arrives and answered at once (Downpour SGD);
- "ssp": pushes are applied as they arrive, but a worker more than `staleness` clocks ahead of the
  slowest waits (Stale Synchronous Parallel, Ho et al. 2013).

The server logs every update: which worker, its clock, the version the gradient was computed at, the
version it was applied to; their difference is the gradient's *staleness*. A worker that falls silent
for `worker_timeout` seconds is declared dead: the asynchronous modes carry on without it and report it;
the synchronous mode cannot, and raises an error that says so instead of waiting forever.
"""

from __future__ import annotations

import datetime
import math
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist

from distlab.async_sgd.messages import Kind, recv_message, send_message
from distlab.async_sgd.problem import Problem, flat_params, gradient, worker_batch
from distlab.async_sgd.ssp import MODES, check_staleness, may_start


@dataclass(frozen=True)
class PSConfig:
    """One training run. `steps` is per worker: sync runs `steps` rounds, the asynchronous modes stop once
    the server has applied steps x W gradients. A worker's gradient takes `compute_time` seconds (a sleep
    that stands for a bigger model), `slowdown` times longer on worker `straggler`. Worker `fail_worker`
    crashes when it reaches clock `fail_at` (an injected fault). A worker silent for `worker_timeout`
    seconds while it owes a gradient is presumed dead; `timeout` bounds every wait for a message."""

    mode: str = "async"
    staleness: int | float = math.inf
    steps: int = 20
    global_batch: int = 48
    lr: float = 0.05
    compute_time: float = 0.0
    straggler: int | None = None
    slowdown: float = 1.0
    fail_worker: int | None = None
    fail_at: int = 0
    worker_timeout: float = 2.0
    timeout: float = 30.0  # seconds any rank waits for one message before its receive fails (no hangs)
    record_every: int = 1
    problem: Problem = field(default_factory=Problem)

    @property
    def threshold(self) -> int | float:
        """The SSP threshold this mode uses: 0 for sync, `staleness` for ssp, infinity for async."""
        return {"sync": 0, "ssp": self.staleness, "async": math.inf}[self.mode]


def validate(config: PSConfig, world_size: int) -> None:
    """Raise ValueError naming the bad setting and the fix."""
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: a parameter server needs at least 2 ranks, rank 0 for "
                         "the server and one or more workers; use world_size >= 2")
    if config.mode not in MODES:
        raise ValueError(f"mode={config.mode!r} is unknown; choose one of {', '.join(MODES)}")
    check_staleness(config.staleness)
    w = world_size - 1
    for name in ("straggler", "fail_worker"):
        value = getattr(config, name)
        bad = isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= w
        if value is not None and bad:
            raise ValueError(f"{name}={value!r} is not a worker: with world_size={world_size} the workers "
                             f"are ranks 1..{w} (rank 0 is the server); pick one of them or None")
    if config.slowdown < 1:
        raise ValueError(f"slowdown={config.slowdown} must be >= 1 (how many times slower the straggler is)")
    if config.steps < 1 or config.global_batch % w:
        raise ValueError(f"steps={config.steps}, global_batch={config.global_batch}: steps must be >= 1 and "
                         f"the global batch divisible by the {w} workers; use a multiple of {w}")
    if config.worker_timeout <= config.compute_time * config.slowdown:
        raise ValueError(f"worker_timeout={config.worker_timeout} s is not longer than the slowest "
                         f"worker's step ({config.compute_time * config.slowdown} s): every worker would "
                         "look dead; raise worker_timeout")
    if config.timeout <= config.worker_timeout:
        raise ValueError(f"timeout={config.timeout} s must be longer than worker_timeout="
                         f"{config.worker_timeout} s, or a receive fails before a dead worker is noticed")


class Update(NamedTuple):
    """One gradient the server applied. staleness = applied_version - read_version; clock_gap = how far
    the worker was ahead of the slowest live worker when it was sent the parameters."""

    worker: int
    clock: int
    read_version: int
    applied_version: int
    staleness: int
    clock_gap: int
    time: float


class Death(NamedTuple):
    """A worker the server declared dead: its clock (pushes received) and the server's version then."""

    worker: int
    clock: int
    version: int
    time: float


@dataclass
class ServerLog:
    """What the server saw: every update, parameter snapshots (version, seconds, params), deaths."""

    config: PSConfig
    num_workers: int
    updates: list[Update] = field(default_factory=list)
    snapshots: list[tuple[int, float, torch.Tensor]] = field(default_factory=list)
    deaths: list[Death] = field(default_factory=list)
    params: torch.Tensor | None = None
    version: int = 0


@dataclass
class WorkerLog:
    """What one worker did: (clock, version read) of every push it sent."""

    worker: int
    pushes: list[tuple[int, int]] = field(default_factory=list)


class WorkerCrash(RuntimeError):
    """The injected fault: a worker process that dies in the middle of training."""


def _reason(e: Exception) -> str:
    """gloo's message without its source location and peer address (they change from run to run)."""
    reason = re.sub(r"^\[[^\]]*\]\s*", "", str(e).splitlines()[0]).split(". ")[0]
    return re.sub(r"\s*\[[\d.:]+\]:\d+", "", reason)


def listen(worker: int, group: dist.ProcessGroup, inbox: queue.Queue) -> None:
    """The server's listener for one worker (a thread): forward each message, or the error that ended the
    connection, to `inbox`; stop after the worker's BYE."""
    while True:
        try:
            msg = recv_message(worker, group)
        except RuntimeError as e:  # the worker's process is gone (gloo: "Connection closed by peer")
            inbox.put((worker, e))
            return
        inbox.put((worker, msg))
        if msg.kind == Kind.BYE:
            return


def serve(config: PSConfig, groups: dict[int, dist.ProcessGroup]) -> ServerLog:
    """The server loop on rank 0; `groups[w]` is the two-rank group {0, w} of worker w."""
    num_workers = len(groups)
    model, _, _ = config.problem.build()
    params = flat_params(model)
    log = ServerLog(config, num_workers)
    start = time.perf_counter()
    log.snapshots.append((0, 0.0, params.clone()))
    inbox: queue.Queue = queue.Queue()
    listeners = [threading.Thread(target=listen, args=(w, g, inbox), daemon=True) for w, g in groups.items()]
    for t in listeners:
        t.start()
    clocks = {w: 0 for w in groups}
    alive, stopped, waiting = set(clocks), set(), []  # waiting: asked for parameters, not yet sent
    heard = {w: 0.0 for w in clocks}  # when each worker last sent, or was sent, something
    gap_at_read: dict[int, int] = {}
    pending: dict[int, tuple[torch.Tensor, int, int]] = {}  # sync: (gradient, clock, version read), by worker
    version, applied, budget = 0, 0, config.steps * num_workers

    def declare_dead(w: int, now: float, why: str) -> None:
        if config.mode == "sync":
            raise RuntimeError(
                f"synchronous mode: worker {w} {why} at version {version}, and a synchronous step needs a "
                f"gradient from every worker, so training cannot go on. Use mode='async' or 'ssp' to "
                f"continue without a dead worker")
        alive.discard(w)
        if w in waiting:
            waiting.remove(w)
        log.deaths.append(Death(w, clocks[w], version, now))

    while alive - stopped:
        done = version >= config.steps if config.mode == "sync" else applied >= budget
        for w in list(waiting):  # answer every worker that may go on
            slowest = min(clocks[u] for u in alive)
            if done or may_start(clocks[w], [clocks[u] for u in alive], config.threshold):
                waiting.remove(w)
                try:
                    if done:
                        send_message(Kind.STOP, w, version, None, w, groups[w])
                        stopped.add(w)
                    else:
                        gap_at_read[w] = clocks[w] - slowest
                        send_message(Kind.PARAMS, w, version, params, w, groups[w])
                        heard[w] = time.perf_counter() - start
                except RuntimeError as e:  # it died while waiting for its answer
                    declare_dead(w, time.perf_counter() - start, f"lost its connection ({_reason(e)})")
        if not alive - stopped:
            break
        try:
            w, msg = inbox.get(timeout=config.worker_timeout / 4)
        except queue.Empty:
            w, msg = None, None
        now = time.perf_counter() - start
        if isinstance(msg, Exception):
            if w in alive:
                declare_dead(w, now, f"lost its connection ({_reason(msg)})")
            continue
        if msg is not None:
            heard[w] = now
        for u in sorted(alive - stopped - set(waiting)):  # workers that owe the server a message
            if now - heard[u] > config.worker_timeout:
                declare_dead(u, now, f"sent nothing for {now - heard[u]:.1f} s "
                                     f"(worker_timeout={config.worker_timeout} s)")
        if msg is None or w not in alive or msg.kind == Kind.BYE:
            continue
        if msg.kind == Kind.PUSH:
            clock, clocks[w] = clocks[w], clocks[w] + 1
            if config.mode == "sync":
                pending[w] = (msg.payload, clock, msg.version)
                if len(pending) == len(alive):  # the round is complete: apply the average once
                    params -= config.lr * torch.stack([g for g, _, _ in pending.values()]).mean(0)
                    log.updates += [Update(u, c, read, version, version - read, gap_at_read[u], now)
                                    for u, (_, c, read) in sorted(pending.items())]
                    pending.clear()
                    version += 1
            else:
                params -= config.lr * msg.payload
                log.updates.append(Update(w, clock, msg.version, version, version - msg.version,
                                          gap_at_read[w], now))
                version += 1
            applied += 1
            if version % config.record_every == 0 and log.snapshots[-1][0] != version:
                log.snapshots.append((version, now, params.clone()))
        waiting.append(w)  # after a PULL or a PUSH, the worker waits for its next parameters
    for t in listeners:  # every live worker answers STOP with BYE, which ends its listener
        t.join(timeout=config.worker_timeout)
    log.params, log.version = params, version
    return log


def work(config: PSConfig, worker: int, num_workers: int, group: dist.ProcessGroup) -> WorkerLog:
    """The loop of worker `worker` (its rank): pull, compute a gradient on its shard, push; until STOP.
    `group` is the two-rank group {0, worker}, in which the server is rank 0."""
    model, X, y = config.problem.build()
    delay = config.compute_time * (config.slowdown if worker == config.straggler else 1.0)
    log = WorkerLog(worker)
    send_message(Kind.PULL, worker, -1, None, 0, group)
    clock = 0
    while True:
        msg = recv_message(0, group)
        if msg.kind == Kind.STOP:
            send_message(Kind.BYE, worker, msg.version, None, 0, group)
            return log
        idx = worker_batch(config.problem, worker, num_workers, clock, config.global_batch)
        g, _ = gradient(model, msg.payload, X[idx], y[idx])
        if delay:
            time.sleep(delay)
        if worker == config.fail_worker and clock == config.fail_at:
            raise WorkerCrash(f"worker {worker} crashed at clock {clock} (the injected fault)")
        send_message(Kind.PUSH, worker, msg.version, g, 0, group)
        log.pushes.append((clock, msg.version))
        clock += 1


def run_rank(config: PSConfig) -> ServerLog | WorkerLog:
    """Every rank's entry point (under `launch.run` or torchrun): rank 0 serves, the others work."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    validate(config, world_size)
    torch.set_num_threads(1)  # tiny tensors: threads would only fight over the cores
    # One two-rank group per worker: a worker that dies breaks its own connection, and no other
    # (in gloo, an error on a connection fails every pending receive of the group it belongs to).
    groups = {w: dist.new_group([0, w], timeout=datetime.timedelta(seconds=config.timeout))
              for w in range(1, world_size)}
    if rank == 0:
        return serve(config, groups)
    return work(config, rank, world_size - 1, groups[rank])
