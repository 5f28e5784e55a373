"""Goodput, useful steps per hour, under failures: checkpoint-restart against replicas that heal.

Failures arrive at random (a Poisson process) with mean time between failures M seconds for the whole
job; a step takes t seconds when nothing fails.

Checkpoint-restart (chapter 9): every tau seconds of work the job writes a checkpoint (delta seconds);
a failure stops every rank, the job restarts (R seconds: new processes, load the checkpoint) and redoes
the work since the last checkpoint. Daly (2006, his complete model) gives the expected wall time of
T_s seconds of work, counting failures during the checkpoints and the restarts too:

    T_wall = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau

so the useful fraction is T_s / T_wall, best at Daly's tau (chapter 9's `daly_interval`; Young 1974's
sqrt(2 delta M) to first order).

Replicas that heal (this chapter): nothing is written and nothing restarts. A failure costs the time to
detect it (t_d: the heartbeat timeout and the failed all-reduce), the attempt of the step it interrupted
(t), and, until a replacement has started and healed from a peer (t_r + t_h seconds), one replica's share
of the throughput, 1/R of it with R replicas. To first order in 1/M the useful fraction is

    1 - (t_d + t + (t_r + t_h) / R) / M

(at least 0; R = 1 has nobody to heal from, and is checkpoint-restart). Useful steps per hour are the
fraction times 3600 / t.
"""

from __future__ import annotations

import math

from distlab.parallel3d.checkpoint.cost_model import daly_interval, young_interval


def _non_negative(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 \
            or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a number of seconds, 0 or more")
    return float(value)


def _positive(name: str, value: float) -> float:
    if _non_negative(name, value) <= 0:
        raise ValueError(f"{name}={value!r} must be a positive number of seconds")
    return float(value)


def daly_wall_time(work: float, interval: float, delta: float, restart: float, mtbf: float) -> float:
    """Daly 2006's expected wall time of `work` seconds of computation, checkpointing every
    `interval` seconds of work at `delta` seconds each, restarting in `restart` seconds, MTBF `mtbf`."""
    w, tau, m = _positive("work", work), _positive("interval", interval), _positive("mtbf", mtbf)
    d, r = _non_negative("delta", delta), _non_negative("restart", restart)
    return m * math.exp(r / m) * math.expm1((tau + d) / m) * w / tau


def checkpoint_goodput(mtbf: float, step_s: float, delta: float, restart: float,
                       interval: float | None = None) -> dict[str, float]:
    """Checkpoint-restart: the interval (Daly's optimum unless given), Young's for comparison, the
    useful fraction and useful steps per hour."""
    m, t = _positive("mtbf", mtbf), _positive("step_s", step_s)
    d = _positive("delta", delta)
    tau = daly_interval(d, m) if interval is None else _positive("interval", interval)
    fraction = 1.0 / daly_wall_time(1.0, tau, d, restart, m)
    return {"interval": tau, "young_interval": young_interval(d, m), "fraction": fraction,
            "steps_per_hour": fraction * 3600 / t}


def healing_goodput(mtbf: float, step_s: float, detect: float, heal: float, replicas: int,
                    replace: float = 0.0) -> dict[str, float]:
    """Replicas that heal: the useful fraction 1 - (t_d + t + (t_r + t_h)/R) / M and steps per hour."""
    m, t = _positive("mtbf", mtbf), _positive("step_s", step_s)
    lost = _non_negative("detect", detect) + t
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
        raise ValueError(f"replicas={replicas!r} must be an integer >= 2: one replica has no live peer to "
                         "heal from (that is checkpoint-restart, checkpoint_goodput)")
    lost += (_non_negative("replace", replace) + _non_negative("heal", heal)) / replicas
    fraction = max(0.0, 1.0 - lost / m)
    return {"fraction": fraction, "steps_per_hour": fraction * 3600 / t, "lost_per_failure": lost}


def mtbf_from_rate(failures_per_day: float) -> float:
    """Seconds between failures for a job that fails `failures_per_day` times a day on average."""
    if isinstance(failures_per_day, bool) or not isinstance(failures_per_day, int | float) \
            or not failures_per_day > 0:
        raise ValueError(f"failures_per_day={failures_per_day!r} must be a positive number")
    return 86400.0 / failures_per_day
