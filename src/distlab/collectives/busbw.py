"""What an nccl-tests-style benchmark reports: message sizes, algbw and busbw, and the tables that print them.

The conventions are those of nccl-tests' doc/PERFORMANCE.md (NVIDIA, 2016-): a size is that of the whole
vector, in bytes (K, M, G are powers of 1024); algbw = size / time; busbw = algbw x `busbw_factor`, a
factor per collective that makes busbw comparable with the link bandwidth whatever the number of ranks.
`bench` measures the times and fills `Row`s; this file only defines and prints them (plain text, no pandas).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from distlab.comm_log import ring_bytes

BUILTIN = "torch"
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "scatter",
               "gather")


def busbw_factor(collective: str, n: int) -> float:
    """busbw / algbw for `collective` on n ranks, as defined in nccl-tests doc/PERFORMANCE.md.

    all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast, reduce 1;
    scatter and gather (n-1)/n (nccl-tests src/scatter.cu, src/gather.cu). With it, busbw can be compared
    with the link bandwidth whatever the number of ranks.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be a positive integer number of ranks, e.g. 4")
    if collective in ("broadcast", "reduce"):
        return 1.0  # nccl-tests' convention, for every n
    return ring_bytes(collective, 1.0, n)  # the bytes a rank sends per byte of the buffer, with a ring


@dataclass(frozen=True)
class Row:
    """One line of the benchmark table (one collective, implementation, world size and size)."""

    collective: str
    implementation: str
    world_size: int
    size: int  # bytes of the whole vector (nccl-tests' convention)
    count: int  # elements of the whole vector
    dtype: str
    time_us: float  # median over repeats of the slowest rank's mean time per call
    algbw_GBps: float  # units in the name, as nccl-tests prints them
    busbw_GBps: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str | int) -> int:
    """"4K" -> 4096, "64M" -> 67108864, 100 -> 100 (K, M, G are powers of 1024, as in nccl-tests)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", str(text), re.IGNORECASE)
        if not match:
            raise ValueError(f"size {text!r} is not a byte count; write e.g. 4096, '4K', '64M' or '1G'")
        value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value <= 0:
        raise ValueError(f"size={text!r} must be a positive number of bytes; use e.g. '4K' or 1024")
    return value


def parse_sizes(text: str | Sequence[str | int]) -> list[int]:
    """"1K:256M" (doubling), "1K:256M:4" (step factor 4), "4M,16M,64M", or a list -> sizes in bytes."""
    if not isinstance(text, str):
        return [parse_size(s) for s in text]
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"sizes {text!r} must be MIN:MAX or MIN:MAX:FACTOR, e.g. '1K:256M' or '1K:1G:4'")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        factor = int(parts[2]) if len(parts) == 3 else 2
        if hi < lo or factor < 2:
            raise ValueError(f"sizes {text!r}: need MIN <= MAX and FACTOR >= 2, e.g. '1K:256M:2'")
        out = [lo]
        while out[-1] * factor <= hi:
            out.append(out[-1] * factor)
        return out
    return [parse_size(s) for s in text.split(",") if s.strip()]


# --------------------------------------------------------------------------------------------------
# Tables (plain text, no pandas)
# --------------------------------------------------------------------------------------------------

_COLUMNS = (("collective", 14, "", "s"), ("implementation", 29, "", "s"), ("ranks", 5, "", "d"),
            ("size", 12, "(B)", "d"), ("count", 12, "(elements)", "d"), ("type", 8, "", "s"),
            ("time", 10, "(us)", ".1f"), ("algbw", 8, "(GB/s)", ".3f"), ("busbw", 8, "(GB/s)", ".3f"))


def format_table(rows: Sequence[Row], header: bool = True) -> str:
    """Fixed-width table in the layout of nccl-tests' output (header lines start with '#')."""
    lines = []
    if header:
        lines.append("#" + " ".join(f"{name:>{w}}" for name, w, _, _ in _COLUMNS)[1:])
        lines.append("#" + " ".join(f"{unit:>{w}}" for _, w, unit, _ in _COLUMNS)[1:])
    for r in rows:
        values = (r.collective, r.implementation, r.world_size, r.size, r.count, r.dtype, r.time_us,
                  r.algbw_GBps, r.busbw_GBps)
        lines.append(" ".join(f"{v:>{w}{fmt}}" for v, (_, w, _, fmt) in zip(values, _COLUMNS, strict=True)))
    return "\n".join(lines)


@dataclass(frozen=True)
class Ratio:
    """Our busbw over the built-in's, for one collective, implementation, world size and size."""

    collective: str
    implementation: str
    world_size: int
    size: int
    busbw_GBps: float
    builtin_busbw_GBps: float
    ratio: float  # = builtin time / our time (equal to the busbw ratio, and defined for 1 rank too)


def ratio_table(rows: Sequence[Row]) -> list[Ratio]:
    """Ours / built-in for every row of ours that has a built-in row of the same collective, size, ranks."""
    builtin = {(r.collective, r.world_size, r.size): r for r in rows if r.implementation == BUILTIN}
    out = []
    for r in rows:
        b = builtin.get((r.collective, r.world_size, r.size))
        if r.implementation != BUILTIN and b is not None:
            out.append(Ratio(r.collective, r.implementation, r.world_size, r.size, r.busbw_GBps, b.busbw_GBps,
                             b.time_us / r.time_us))
    return sorted(out, key=lambda x: (x.collective, x.implementation, x.world_size, x.size))


def format_ratio_table(ratios: Sequence[Ratio]) -> str:
    """Fixed-width text of `ratio_table(rows)`."""
    lines = [f"#{'collective':>13} {'implementation':>29} {'ranks':>5} {'size':>12} {'busbw':>8} "
             f"{'torch':>8} {'ours/torch':>10}",
             f"#{'':>13} {'':>29} {'':>5} {'(B)':>12} {'(GB/s)':>8} {'(GB/s)':>8} {'':>10}"]
    for r in ratios:
        lines.append(f"{r.collective:>14} {r.implementation:>29} {r.world_size:>5} {r.size:>12} "
                     f"{r.busbw_GBps:>8.3f} {r.builtin_busbw_GBps:>8.3f} {r.ratio:>10.2f}")
    return "\n".join(lines)
