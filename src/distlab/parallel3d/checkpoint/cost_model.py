"""How often to checkpoint, and what a failure costs: the closed forms the checkpoint lab predicts with.

A job checkpoints every tau seconds of work; writing one costs delta seconds; failures arrive at random
(a Poisson process) with mean time between failures M. Too rarely, and a failure throws away up to tau
of work; too often, and the job spends its time writing. Young (1974) minimised the expected loss to
first order and found tau = sqrt(2 delta M); Daly (2006, eq. 37) carried the expansion further:

    tau = sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)] - delta   for delta < 2M,
    tau = M                                                                           otherwise.

In steps: a failure just before step S, with checkpoints after every k steps, loses the S - k floor(S/k)
steps done since the last checkpoint (0 .. k - 1 of them; (k - 1)/2 on average when S is uniform).
"""

from __future__ import annotations

import math


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            and math.isfinite(value)):
        raise ValueError(f"{name}={value!r} must be a positive number of seconds (or steps)")
    return float(value)


def young_interval(delta: float, mtbf: float) -> float:
    """Young 1974's first-order optimum checkpoint interval sqrt(2 delta M) (same unit as the inputs)."""
    return math.sqrt(2 * _positive("delta", delta) * _positive("mtbf", mtbf))


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly 2006's higher-order optimum interval (eq. 37): Young's, corrected for delta not << M."""
    d, m = _positive("delta", delta), _positive("mtbf", mtbf)
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def steps_lost(kill_at: int, every: int) -> int:
    """Steps redone after a failure just before step `kill_at` (0-based), checkpointing every `every`."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every={every!r} must be a positive number of steps between checkpoints")
    if isinstance(kill_at, bool) or not isinstance(kill_at, int) or kill_at < 0:
        raise ValueError(f"kill_at={kill_at!r} must be a step number, 0 or more")
    return kill_at - (kill_at // every) * every


def cluster_mtbf(gpu_mtbf_hours: float, n_gpus: int) -> float:
    """The job's MTBF in hours when any one of `n_gpus` independent GPUs failing stops it: M_gpu / n."""
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or n_gpus < 1:
        raise ValueError(f"n_gpus={n_gpus!r} must be a positive integer")
    return _positive("gpu_mtbf_hours", gpu_mtbf_hours) / n_gpus
