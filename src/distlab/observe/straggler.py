"""A straggler, found: per-rank step times, a robust outlier rule, and how long the others waited.

In synchronous training every rank's *step* takes as long as the slowest rank's, because each waits in
the gradient all-reduce for the last one to arrive; the straggler is invisible in step times. What
differs is how a step splits: the straggler computes longest and waits least, the others compute and
then wait for it. So each rank times two things per step, the work before the collective and the time
inside it, and the rule looks for the rank whose work is an outlier.

The rule: rank r is a straggler when its median work time exceeds median + k * scale over the ranks,
with scale the median absolute deviation times 1.4826 (the MAD, consistent with the standard deviation
for normal data), k = 3 by default (Leys et al. 2013, "Detecting outliers: do not use standard deviation
around the mean, use absolute deviation around the median", J. Exp. Soc. Psychol. 49(4); they call 3
very conservative and 2.5 moderate). The median and the MAD are not pulled by the outlier itself, as a mean
and a standard deviation are. With few ranks all alike the MAD is 0, so the scale has a floor, `rel_floor`
of the median. NVIDIA's resiliency extension scores each rank's kernel and section times against the
others' in the same spirit (nvidia-resiliency-ext, "Straggler detection").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distlab import launch

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): the MAD of normal data times this is its standard deviation


@dataclass(frozen=True)
class StragglerReport:
    """Per rank: median work and wait seconds per step; the threshold; the ranks above it."""

    work: tuple[float, ...]
    wait: tuple[float, ...]
    threshold: float
    stragglers: tuple[int, ...]

    def others_waited(self) -> float:
        """Median over the other ranks of their median wait per step (0 without a straggler)."""
        others = [w for r, w in enumerate(self.wait) if r not in self.stragglers]
        return statistics.median(others) if self.stragglers and others else 0.0

    def verdict(self) -> str:
        """Which rank(s) the rule names, in words."""
        if not self.stragglers:
            return f"no straggler: every rank's work is under the threshold of {len(self.work)} ranks"
        names = ", ".join(str(r) for r in self.stragglers)
        return f"straggler: rank {names} (work above median + k x MAD); the other ranks wait for it"


def outliers(values: Sequence[float], k: float = 3.0,
             rel_floor: float = 0.05) -> tuple[float, tuple[int, ...]]:
    """(threshold, indices above it): median + k * max(1.4826 * MAD, rel_floor * median) (Leys et al.
    2013)."""
    if not values:
        raise ValueError("values is empty: pass one number per rank")
    if k <= 0 or rel_floor < 0:
        raise ValueError(f"k={k} and rel_floor={rel_floor}: k must be > 0 (2.5 or 3) and rel_floor >= 0")
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    threshold = med + k * max(MAD_TO_SIGMA * mad, rel_floor * abs(med))
    return threshold, tuple(i for i, v in enumerate(values) if v > threshold)


def find_stragglers(work: Sequence[Sequence[float]], wait: Sequence[Sequence[float]], k: float = 3.0,
                    rel_floor: float = 0.05) -> StragglerReport:
    """The report from per-rank lists of per-step work and wait seconds (rank r's are work[r], wait[r])."""
    if len(work) != len(wait) or not work:
        raise ValueError(f"work has {len(work)} ranks and wait {len(wait)}: pass one list per rank in each")
    med_work = tuple(statistics.median(w) for w in work)
    med_wait = tuple(statistics.median(w) for w in wait)
    threshold, slow = outliers(med_work, k, rel_floor)
    return StragglerReport(med_work, med_wait, threshold, slow)


def timed_steps(steps: int, delay: float, slow_rank: int, size: int = 1 << 16, matmuls: int = 4,
                group: dist.ProcessGroup | None = None,
                device: torch.device | None = None) -> tuple[list[float], list[float]]:
    """On a rank: `steps` steps of work (`matmuls` small matrix products) then a gradient-sized
    all-reduce; rank `slow_rank` of `group` sleeps `delay` seconds more per step. Tensors on `device`
    (default: `launch.device()`, the CPU on gloo, this rank's GPU on NCCL). Returns this rank's (work
    seconds, wait seconds) per step."""
    if steps < 1 or delay < 0:
        raise ValueError(f"steps={steps} and delay={delay}: steps must be >= 1 and delay >= 0 seconds")
    dev = device or launch.device()
    me = dist.get_rank(group)
    a = torch.randn(64, 64, device=dev)
    grad = torch.ones(size, device=dev)
    dist.barrier(group=group)
    work, wait = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        for _ in range(matmuls):
            a = torch.tanh(a @ a)
        if me == slow_rank:
            time.sleep(delay)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t1 = time.perf_counter()
        dist.all_reduce(grad, group=group)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        work.append(t1 - t0)
        wait.append(time.perf_counter() - t1)
    return work, wait
