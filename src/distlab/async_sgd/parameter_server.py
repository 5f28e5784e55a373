"""A parameter server on torch.distributed point-to-point messages: one server, W workers, three modes.

The job runs in one process group (`group=`, None: the whole world; ranks are positions in it): rank 0
is the server and holds the parameters, ranks 1..W are workers (Dean et al. 2012, sec. 4.1; Li et al.
2014, sec. 3). Each worker loops: receive the current parameters (PARAMS), compute a gradient on its
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
the synchronous mode cannot, and raises an error that says so instead of waiting forever. The server's
loop is in `server`; this file holds the run's settings, their validation, and the worker's loop.

Every message travels inside the job's group. gloo keeps one connection per pair of ranks, and a worker
that dies breaks only its own: the server's receives from the other workers go on (the dead-worker
tests check it). So no extra group is needed to isolate failures, and no rank outside the job takes part.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from distlab.async_sgd.messages import Kind, recv_message, send_message
from distlab.async_sgd.problem import Problem, gradient, worker_batch
from distlab.async_sgd.server import ServerLog, serve
from distlab.async_sgd.ssp import MODES, check_staleness


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
    """Raise ValueError naming the bad setting and the fix; `world_size` is the size of the job's group
    (the server and the workers)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size={world_size}: a parameter server needs at least 2 ranks, rank 0 for "
                         "the server and one or more workers; use world_size >= 2")
    _check_mode(config)
    _check_roles(config, world_size)
    _check_training(config, world_size - 1)
    _check_timing(config)


def _whole(value: object, low: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= low


def _check_mode(config: PSConfig) -> None:
    if config.mode not in MODES:
        raise ValueError(f"mode={config.mode!r} is unknown; choose one of {', '.join(MODES)}")
    check_staleness(config.staleness)
    if config.mode == "ssp" and config.staleness == math.inf:
        raise ValueError("mode='ssp' with staleness=inf is fully asynchronous; give SSP a finite threshold, "
                         "e.g. staleness=2, or use mode='async'")
    if config.mode != "ssp" and config.staleness not in (math.inf, 0 if config.mode == "sync" else math.inf):
        raise ValueError(f"staleness={config.staleness!r} applies only to mode='ssp', and mode="
                         f"{config.mode!r} would ignore it; use mode='ssp' to bound the staleness")


def _check_roles(config: PSConfig, world_size: int) -> None:
    w = world_size - 1
    for name in ("straggler", "fail_worker"):
        value = getattr(config, name)
        if value is not None and not (_whole(value, 1) and value <= w):
            raise ValueError(f"{name}={value!r} is not a worker: with world_size={world_size} the workers "
                             f"are ranks 1..{w} (rank 0 is the server); pick one of them or None")
    if not (math.isfinite(config.slowdown) and config.slowdown >= 1):
        raise ValueError(f"slowdown={config.slowdown} must be >= 1 (how many times slower the straggler is)")
    if config.fail_worker is not None and not (_whole(config.fail_at, 0) and config.fail_at < config.steps):
        raise ValueError(f"fail_at={config.fail_at!r} must be a clock from 0 to steps - 1 = "
                         f"{config.steps - 1}: sync stops after `steps` rounds, so a later fault would "
                         "silently never happen")


def _check_training(config: PSConfig, w: int) -> None:
    batch, n = config.global_batch, config.problem.n
    if not _whole(config.steps, 1) or not _whole(batch, w) or batch % w or batch > n:
        raise ValueError(f"steps={config.steps}, global_batch={batch}: steps must be >= 1 and the global "
                         f"batch at most the {n} examples and divisible by the {w} workers; use a multiple "
                         f"of {w}")
    if isinstance(config.lr, bool) or not math.isfinite(config.lr) or config.lr <= 0:
        raise ValueError(f"lr={config.lr!r} must be a finite positive number (NaN or infinity makes every "
                         "parameter NaN, zero leaves them unchanged); e.g. lr=0.05")
    if not _whole(config.record_every, 1):
        raise ValueError(f"record_every={config.record_every!r} must be a positive integer (1: a snapshot of "
                         "the parameters at every version)")


def _check_timing(config: PSConfig) -> None:
    if not (math.isfinite(config.compute_time) and config.compute_time >= 0):
        raise ValueError(f"compute_time={config.compute_time} must be a number of seconds >= 0")
    for name in ("worker_timeout", "timeout"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or value <= 0:
            raise ValueError(f"{name}={value!r} must be a finite number of seconds > 0 (infinity or NaN "
                             f"would never time out, or fail when handed to the socket); e.g. {name}="
                             f"{30 if name == 'timeout' else 2}")
    if config.worker_timeout <= config.compute_time * config.slowdown:
        raise ValueError(f"worker_timeout={config.worker_timeout} s is not longer than the slowest "
                         f"worker's step ({config.compute_time * config.slowdown} s): every worker would "
                         "look dead; raise worker_timeout")
    if config.timeout <= config.worker_timeout:
        raise ValueError(f"timeout={config.timeout} s must be longer than worker_timeout="
                         f"{config.worker_timeout} s, or a receive fails before a dead worker is noticed")


@dataclass
class WorkerLog:
    """What one worker did: (clock, version read) of every push it sent."""

    worker: int
    pushes: list[tuple[int, int]] = field(default_factory=list)


class WorkerCrash(RuntimeError):
    """The injected fault: a worker process that dies in the middle of training."""


def work(config: PSConfig, worker: int, num_workers: int,
         group: dist.ProcessGroup | None = None) -> WorkerLog:
    """The loop of worker `worker` (its position in `group`, where the server is at 0): pull, compute a
    gradient on its shard, push; until STOP."""
    model, X, y = config.problem.build()
    delay = config.compute_time * (config.slowdown if worker == config.straggler else 1.0)
    log = WorkerLog(worker)
    send_message(Kind.PULL, worker, -1, None, 0, group, config.timeout)
    clock = 0
    while True:
        msg = recv_message(0, group, config.timeout)
        if msg.kind == Kind.STOP:
            send_message(Kind.BYE, worker, msg.version, None, 0, group, config.timeout)
            return log
        idx = worker_batch(config.problem, worker, num_workers, clock, config.global_batch)
        g, _ = gradient(model, msg.payload, X[idx], y[idx])
        if delay:
            time.sleep(delay)
        if worker == config.fail_worker and clock == config.fail_at:
            raise WorkerCrash(f"worker {worker} crashed at clock {clock} (the injected fault)")
        send_message(Kind.PUSH, worker, msg.version, g, 0, group, config.timeout)
        log.pushes.append((clock, msg.version))
        clock += 1


def run_rank(config: PSConfig, group: dist.ProcessGroup | None = None) -> ServerLog | WorkerLog:
    """Every rank's entry point (under `launch.run` or torchrun): the parameter-server job runs in `group`
    (None: the whole world); its position 0 serves, positions 1..W work.

    Only the job's ranks call it, and nothing here is collective over the world: every message is a
    point-to-point transfer inside `group`, so several jobs can run at once, one per group of a mesh dim.
    """
    size, position = dist.get_world_size(group), dist.get_rank(group)
    if position < 0:
        raise ValueError(f"this rank (global rank {dist.get_rank()}) is not a member of the process group it "
                         "was given; call run_rank only on the job's ranks, each with its own job's group")
    validate(config, size)
    torch.set_num_threads(1)  # tiny tensors: threads would only fight over the cores
    if position == 0:
        return serve(config, size - 1, group)
    return work(config, position, size - 1, group)
