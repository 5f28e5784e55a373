"""Parity: the parameter server in synchronous mode is single-process SGD on the whole global batch.

In sync mode each worker's shard of clock t's global batch is a slice of batch t, and the server applies
the mean of the W shard gradients, which is the gradient of the whole batch (Dean et al. 2012 call this
the synchronous baseline of Downpour SGD). So the server's parameters after every step must equal
`problem.sgd_reference` (the course's one single-process loop, `distlab.reference.train_reference`), up
to float32 rounding: the sums run in another order (W shard means, then their mean), which moves a
parameter by a few ulps per step. float32's tolerance in `distlab.parity.TOLERANCE`, 1e-5 over a few
steps, allows a hundred times that and is far below a real bug (a shard dropped, a gradient applied twice
or stale). The staleness of every applied gradient is compared too: the reference's is 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from distlab.async_sgd.server import ServerLog
from distlab.parity import ParityReport, compare


def sync_parity(log: ServerLog, reference: Sequence[Tensor], label: str) -> ParityReport:
    """Every snapshot of a synchronous run (the parameters at versions 0 .. steps) against the reference's
    parameters after the same step, and the largest staleness against 0. Print its `verdict()`."""
    steps = len(reference) - 1
    if steps < 1:
        raise ValueError(f"the reference has {steps + 1} entries, the initial point and no step; compare "
                         "at least one step (sgd_reference(problem, steps >= 1, ...))")
    versions = [v for v, _, _ in log.snapshots]
    if versions != list(range(steps + 1)):
        raise AssertionError(f"{label}: the server recorded versions {versions}, expected 0 to {steps}: run "
                             f"mode='sync' with steps={steps} and record_every=1")
    ours = {"snapshots": {str(v): got for v, _, got in log.snapshots},
            "staleness": max((u.staleness for u in log.updates), default=0)}
    want = {"snapshots": {str(v): p for v, p in enumerate(reference)}, "staleness": 0}
    return compare(ours, want, label=label, against="single-process SGD")
