"""Chapter 3: asynchronous SGD, the parameter server, stale synchronous parallel, and Hogwild!.

One idea per file:
- `messages`: the framing of every message (a four-field header, then the payload) on send/recv.
- `ssp`: the admission rule of Stale Synchronous Parallel (Ho et al. 2013) and its staleness bound;
  sync and async are the same rule with s = 0 and s = infinity.
- `problem`: the model and data every worker and the server share, and the single-process reference.
- `parameter_server`: the server and worker loops (Dean et al. 2012; Li et al. 2014), three modes,
  staleness bookkeeping, dead-worker detection; `experiments`: launching runs and reading their logs.
- `schedule`: the same rule simulated in time (deterministic schedules and staleness for the book).
- `staleness`: SGD with delayed gradients, and the largest stable learning rate for a delay.
- `hogwild`: lock-free SGD on shared memory for sparse problems (Recht et al. 2011), and a locked variant.
- `figures`: the pictures; `exercises`: the check of the lab's exercise.
- `python -m distlab.async_sgd`: one run from the command line, or under torchrun.
"""

from distlab.async_sgd.messages import HEADER_LEN, Kind, Message, recv_message, send_message
from distlab.async_sgd.parameter_server import Death, PSConfig, ServerLog, Update, WorkerLog, run_rank
from distlab.async_sgd.problem import Problem, sgd_reference
from distlab.async_sgd.schedule import Step, simulate
from distlab.async_sgd.ssp import MODES, may_start, version_staleness_bound

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
    "may_start",
    "recv_message",
    "run_rank",
    "send_message",
    "sgd_reference",
    "simulate",
    "version_staleness_bound",
]
