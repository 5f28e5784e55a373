"""Launching parameter-server runs from a notebook or a test, and turning their logs into curves.

`train(config, num_workers)` starts 1 + num_workers ranks and returns a `Run`: the server's log and each
worker's log (or, for a worker that was made to crash, its `launch.RankError`). `loss_curve` evaluates
the server's parameter snapshots on the whole data set afterwards, so that measuring the loss never
slows the server down. `compare_modes` runs sync, SSP and async on the same problem and straggler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from distlab import launch
from distlab.async_sgd.parameter_server import PSConfig, WorkerLog, run_rank, validate
from distlab.async_sgd.problem import loss_at, one_thread
from distlab.async_sgd.server import ServerLog


@dataclass
class Run:
    """One finished run: the server's log and, per worker (index 0 is worker 1), its log or its error."""

    server: ServerLog
    workers: list[WorkerLog | launch.RankError]

    @property
    def label(self) -> str:
        c = self.server.config
        return {"sync": "sync", "async": "async"}.get(c.mode, f"SSP (s={c.staleness})")

    def staleness(self) -> np.ndarray:
        """The staleness of every applied update, in the order they were applied."""
        return np.array([u.staleness for u in self.server.updates], dtype=int)


def train(config: PSConfig, num_workers: int) -> Run:
    """Run the parameter server with `num_workers` workers (world size num_workers + 1) and collect logs.
    A rank that waits longer than `config.timeout` for a message fails the run (no hangs)."""
    validate(config, num_workers + 1)
    may_fail = [config.fail_worker] if config.fail_worker is not None else []
    # gloo even on a GPU node: the server receives from any worker and keeps its parameters on the CPU
    results = launch.run(run_rank, num_workers + 1, config, backend="gloo", timeout=config.timeout,
                         may_fail=may_fail)
    return Run(results[0], results[1:])


def loss_curve(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gradients applied, seconds, loss on all n points) at each parameter snapshot of the run.

    In sync mode one version is W gradients, so the first axis counts gradients, not versions, and the
    modes can be compared on the same work."""
    model, X, y = run.server.config.problem.build()
    per_version = run.server.num_workers if run.server.config.mode == "sync" else 1
    versions = np.array([v for v, _, _ in run.server.snapshots])
    times = np.array([t for _, t, _ in run.server.snapshots])
    with one_thread():
        losses = np.array([loss_at(model, p, X, y) for _, _, p in run.server.snapshots])
    return versions * per_version, times, losses


def compare_modes(num_workers: int = 3, staleness: Sequence[int] = (2,), steps: int = 30,
                  compute_time: float = 0.01, slowdown: float = 4.0, lr: float = 0.05,
                  seed: int = 0) -> list[Run]:
    """Sync, SSP(s) for each s, and async on the same problem, worker 1 a straggler `slowdown` x slower."""
    base = PSConfig(steps=steps, compute_time=compute_time, straggler=1, slowdown=slowdown, lr=lr,
                    worker_timeout=max(2.0, 4 * compute_time * slowdown))
    configs = [replace(base, mode="sync")]
    configs += [replace(base, mode="ssp", staleness=s) for s in staleness]
    configs.append(replace(base, mode="async", staleness=math.inf))
    return [train(c, num_workers) for c in configs]
