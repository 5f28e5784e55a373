"""The bounds the planner's inputs must stay within, with the reason for each, and the checks that apply them.

A number outside these is a typo, not a machine: `--batch 1e30`, `--hbm-gb inf`, `--efficiency 1e-300`.
Each bound is generous (about ten times the largest real value known to us) and says why; every check
raises a one-line ValueError naming the parameter, its value, the bound and the fix.
"""

from __future__ import annotations

import math

# name -> (largest accepted value, what the largest real one is)
BOUNDS: dict[str, tuple[float, str]] = {
    "layers": (10_000, "the deepest published LLMs have a few hundred blocks"),
    "hidden": (1_000_000, "the widest published LLMs have h of a few tens of thousands"),
    "heads": (100_000, "published LLMs have at most a few hundred attention heads"),
    "kv_heads": (100_000, "published LLMs have at most a few hundred attention heads"),
    "ffn": (10_000_000, "published FFN sizes are at most a few hundred thousand"),
    "vocab": (10_000_000, "published vocabularies hold at most a few hundred thousand tokens"),
    "seq": (100_000_000, "the longest published training contexts are about 10 million tokens"),
    "nodes": (100_000, "the largest GPU clusters hold about 100,000 GPUs"),
    "gpus_per_node": (1_024, "the largest NVLink domains (NVL72, NVL576) join 72 to 576 GPUs"),
    "batch": (100_000_000, "published global batches are at most a few hundred thousand sequences"),
    "micro_batch": (100_000, "a micro-batch is at most a few hundred sequences"),
    "hbm_gb": (10_000, "the largest GPUs carry a few hundred GB of HBM"),
    "intra_GBps": (100_000, "NVLink 5 gives a GPU 900 GB/s per direction"),
    "inter_GBps": (100_000, "a server's NICs give a GPU at most about 100 GB/s per direction"),
    "gpus": (1_000_000, "the largest GPU clusters hold about 100,000 GPUs"),
}
MIN_EFFICIENCY = 0.01  # below 1 % of peak no matrix multiply runs; 1e-300 is a typo


def check_int(name: str, value: object, low: int = 1, flag: str | None = None) -> int:
    """`value` as a whole number in [low, BOUNDS[name]]; else a ValueError naming it and the fix."""
    flag = flag or "--" + name.replace("_", "-")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be a whole number, e.g. {flag} 8")
    if value < low:
        raise ValueError(f"{name}={value} must be at least {low}")
    high, why = BOUNDS.get(name, (math.inf, ""))
    if value > high:
        raise ValueError(f"{name}={value} is beyond any real machine or model: the bound is {high:,} "
                         f"({why}); check the value")
    return value


def check_real(name: str, value: object, low: float = 0.0, high: float | None = None) -> float:
    """`value` as a finite number, > low and <= high (default BOUNDS[name]); else a one-line ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if value <= low:
        raise ValueError(f"{name}={value!r} must be greater than {low:g}")
    bound, why = (high, "") if high is not None else BOUNDS.get(name, (math.inf, ""))
    if value > bound:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name}={value!r} is beyond any real machine: the bound is {bound:,g}{reason}; "
                         "check the value")
    return float(value)


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending, found in O(sqrt n) steps (a prime of 1e9 takes 3e4, not 1e9)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]
