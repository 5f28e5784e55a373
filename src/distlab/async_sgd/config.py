"""The settings of one parameter-server run (`PSConfig`), which the server's loop (`server`) and the
workers' (`parameter_server`) both read; `parameter_server.validate` checks them at the boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from distlab.async_sgd.problem import Problem


@dataclass(frozen=True)
class PSConfig:
    """One training run. `steps` is per worker: sync runs `steps` rounds, the asynchronous modes apply
    exactly steps x W gradients (the server hands out no parameters the budget has no room for). A
    worker's gradient takes `compute_time` seconds (a sleep that stands for a bigger model), `slowdown`
    times longer on worker `straggler`. Worker `fail_worker` crashes when it reaches clock `fail_at` (an
    injected fault). A worker silent for `worker_timeout` seconds while it owes a gradient is presumed
    dead; `timeout` bounds every wait for a message."""

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
