"""Chapter 3: asynchronous SGD, the parameter server, stale synchronous parallel, and Hogwild!.

A parameter-server job runs in one process group (`run_rank(config, group=...)`, None: the whole world):
position 0 of the group is the server, positions 1..W are the workers.

One idea per file:
- `messages`: the framing of every message (a four-field header, then the payload) on send/recv.
- `ssp`: the admission rule of Stale Synchronous Parallel (Ho et al. 2013); sync and async are the same
  rule with s = 0 and s = infinity.
- `cost_model`: the closed forms: time of sync and async training, SSP's staleness bound, the largest
  stable learning rate for a delay.
- `problem`: the model and data every worker and the server share, and the single-process reference.
- `server`: the server's loop, one handler per kind of message, and its log (Dean et al. 2012; Li et al.
  2014); `config`: the run's settings (`PSConfig`), which both read; `parameter_server`: their
  validation, the worker's loop and every rank's entry point.
- `parity`: a synchronous run against single-process SGD, with the tolerance stated.
- `runs`: launching runs and reading their logs.
- `simulate`: the same rule simulated in time (deterministic schedules and staleness for the book).
- `staleness`: SGD with delayed gradients, and the check of the stable learning rate.
- `hogwild`: lock-free SGD on shared memory for sparse problems (Recht et al. 2011), and a locked variant.
- `figures`: the pictures; `exercises`: the check of the lab's exercise.
- `__main__`: `python -m distlab.async_sgd`, one run from the command line, or under torchrun.
"""

from distlab.async_sgd.config import PSConfig
from distlab.async_sgd.cost_model import async_seconds, max_stable_lr, sync_seconds, version_staleness_bound
from distlab.async_sgd.messages import HEADER_LEN, Kind, Message, recv_message, send_message
from distlab.async_sgd.parameter_server import WorkerLog, run_rank
from distlab.async_sgd.problem import Problem, sgd_reference
from distlab.async_sgd.server import Death, ServerLog, Update
from distlab.async_sgd.simulate import Step, simulate
from distlab.async_sgd.ssp import MODES, may_start

__all__ = [
    "HEADER_LEN",
    "MODES",
    "Death",
    "Kind",
    "Message",
    "PSConfig",
    "Problem",
    "ServerLog",
    "Step",
    "Update",
    "WorkerLog",
    "async_seconds",
    "max_stable_lr",
    "may_start",
    "recv_message",
    "run_rank",
    "send_message",
    "sgd_reference",
    "simulate",
    "sync_seconds",
    "version_staleness_bound",
]
