"""How fast one GPU's kernels run, by kind: a matrix multiply's efficiency against its size, the cast of a
bf16 tensor to FP8, and the memory-bound work, each per GPU type, measured or from a stated fallback.

A roofline (Williams, Waterman & Patterson 2009) gives a kernel's best time; a real kernel adds a cost that
does not grow with the work (the launch, the prologue and epilogue of its tiles, a last partial wave of
thread blocks over the SMs). With t_0 that fixed cost, a GEMM of F = 2 M N K FLOPs takes

    t(F) = F / (e_max P) + t_0,   so its efficiency is   e(F) = F / (P t(F)) = e_max F / (F + F_half)

with F_half = e_max P t_0, the size at which it reaches half of e_max: large GEMMs approach e_max, small
ones are dominated by t_0 (`GemmCurve`). A cast of n bf16 values to FP8 with current scaling reads the
tensor twice (its amax, then the scaled copy) and writes one byte per value, 5 n bytes, at a fraction
`hbm_fraction` of the HBM bandwidth W, plus its own fixed cost: t = t_0 + 5 n / (f W) (`CastCost`). Both
are straight lines in the work, so `fit_line` fits either from timed points by least squares on the
relative error (what `make gpu-check` measures, `distlab.gpu_check.gemm`).

The fallbacks (`fallback`), where no grid was measured, are this course's own measurements on GPU nodes
(issue 35 of the course's tracker, torch 2.11.0+cu130): on one H200, the bf16 and FP8 GEMMs of an FP8
comparison ran at 71 to 79 % of their peaks (e_max 0.75, the middle) and its compiled casts at about a
quarter of the HBM roofline; the FP8-over-bf16 speed of a d x d x d product with both casts was 0.13x,
0.18x, 0.62x, 1.00x and 1.39x at d = 1,024 to 16,384 (`H200_FP8_SPEEDUP`), to which `fallback_cast`
fits the cast's fixed cost. The H100 has the H200's compute (the same GH100 chip and peaks; NVIDIA 2024,
the H200 product page) and carries its GEMM curve; its memory-bound work runs at the 82 % of its HBM
bandwidth that `make gpu-check` measured for a device-to-device copy (`assets/gpu/`). The peaks and
bandwidths come from `distlab.catalog` (chapter 8's table), with their sources.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from distlab import catalog

# Peak dense (no sparsity) bf16 and FP8 Tensor Core FLOP/s and HBM bytes/s, from chapter 8's catalog, where
# each row carries its source (H100 SXM5: nvidia2022hopper; H200 SXM: nvidia2024h200, whose page prints the
# "with sparsity" figures, twice these).


def _spec(gpu: str) -> tuple[float, float, float, str]:
    row = catalog.lookup("gpu", gpu)
    return row.dense_16bit_tflops * 1e12, row.dense_fp8_tflops * 1e12, row.memory_GBps * 1e9, row.source


SPECS = {gpu: _spec(gpu) for gpu in ("H100", "H200")}

# FP8 (tensorwise, current scaling, casts compiled) over bf16 speed of a d x d x d matmul on one H200,
# measured with this course's code (issue 35): (d, t_bf16 / t_fp8).
H200_FP8_SPEEDUP = ((1024, 0.13), (2048, 0.18), (4096, 0.62), (8192, 1.00), (16384, 1.39))
CAST_BYTES_PER_VALUE = 5  # current scaling: read bf16 twice (amax, then scale), write 1 byte


def fit_line(work: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of t = slope * work + intercept by least squares on the relative error, the
    intercept kept >= 0 (a kernel cannot take less than no time). Needs two points of different work."""
    x, t = np.asarray(work, float), np.asarray(seconds, float)
    if x.size < 2 or np.ptp(x) == 0 or x.shape != t.shape:
        raise ValueError(f"fit_line needs at least 2 points of different work and as many times, got "
                         f"{x.size} work values and {t.size} times; time more sizes")
    if np.any(t <= 0) or np.any(x <= 0):
        raise ValueError("fit_line: every work value and time must be positive; a time <= 0 is a timing "
                         "error")
    a = np.stack([x / t, 1 / t], axis=1)
    (slope, intercept), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if intercept < 0:  # refit through the origin
        slope, intercept = float(np.sum(x / t) / np.sum((x / t) ** 2)), 0.0
    return float(slope), float(intercept)


@dataclass(frozen=True)
class GemmCurve:
    """e(F) = e_max F / (F + f_half) of a peak `peak` FLOP/s (module docstring); `source` says whence."""

    e_max: float
    f_half: float
    peak: float
    source: str

    def __post_init__(self) -> None:
        if not 0 < self.e_max <= 1 or self.f_half < 0 or self.peak <= 0:
            raise ValueError(f"GemmCurve(e_max={self.e_max}, f_half={self.f_half}, peak={self.peak}): need "
                             "0 < e_max <= 1, f_half >= 0 and a positive peak")

    def efficiency(self, flops: float) -> float:
        """The fraction of the peak a GEMM of `flops` FLOPs reaches."""
        return self.e_max * flops / (flops + self.f_half)

    def seconds(self, m: float, n: float, k: float) -> float:
        """The time of an (m x k) @ (k x n) product: 2 m n k / (e_max P) + t_0."""
        flops = 2.0 * m * n * k
        return (flops + self.f_half) / (self.e_max * self.peak)

    @classmethod
    def fit(cls, shapes: Sequence[tuple[int, int, int]], seconds: Sequence[float], peak: float, source: str
            ) -> GemmCurve:
        """The curve through timed (m, n, k) products (`fit_line` on F = 2 m n k)."""
        slope, intercept = fit_line([2.0 * m * n * k for m, n, k in shapes], seconds)
        e_max = 1 / (slope * peak)
        if e_max > 1:
            raise ValueError(f"the timed GEMMs imply {e_max:.2f} of peak={peak:.3g} FLOP/s, above the peak: "
                             "check the peak (dense, this dtype) or the timings")
        return cls(e_max, intercept / slope, peak, source)


@dataclass(frozen=True)
class CastCost:
    """A bf16 -> FP8 cast of n values: t_0 + 5 n / (hbm_fraction W) (module docstring)."""

    hbm_fraction: float
    fixed_s: float
    hbm_bytes_per_s: float
    source: str

    def seconds(self, values: float, bytes_per_value: float = CAST_BYTES_PER_VALUE) -> float:
        """n values cast, moving `bytes_per_value` each (5 with current scaling, 3 with delayed)."""
        return self.fixed_s + bytes_per_value * values / (self.hbm_fraction * self.hbm_bytes_per_s)

    @classmethod
    def fit(cls, values: Sequence[float], seconds: Sequence[float], hbm_bytes_per_s: float, source: str
            ) -> CastCost:
        """The cost through timed casts of `values` values each (`fit_line` on the bytes)."""
        slope, intercept = fit_line([CAST_BYTES_PER_VALUE * v for v in values], seconds)
        return cls(1 / (slope * hbm_bytes_per_s), intercept, hbm_bytes_per_s, source)


@dataclass(frozen=True)
class KernelRates:
    """Everything the step-time and FP8 models need about one GPU type."""

    gpu: str
    bf16: GemmCurve
    fp8: GemmCurve
    cast: CastCost
    hbm_bytes_per_s: float
    hbm_fraction: float  # what memory-bound elementwise kernels reach
    flash_efficiency: float  # flash attention, of the bf16 peak, on the FLOPs it executes
    source: str
    sync_s: float = 25e-6  # one host synchronisation with its launches (HOST_SYNC_S)

    @property
    def peak(self) -> float:
        return self.bf16.peak

    def memory_seconds(self, nbytes: float) -> float:
        """Memory-bound work: bytes over the achieved HBM bandwidth."""
        return nbytes / (self.hbm_fraction * self.hbm_bytes_per_s)


ISSUE_35 = "this course's code on one H200, torch 2.11.0+cu130 (issue 35)"
GEMM_E_MAX = 0.75  # the middle of the 71-79 % of peak measured for bf16 and FP8 GEMMs (ISSUE_35)
CAST_QUARTER = 0.25  # "casts at about a quarter of the HBM roofline" (ISSUE_35)
H100_COPY_FRACTION = 0.82  # device-to-device copy, 2762 of 3350 GB/s (assets/gpu/nvidia-h100-80gb-hbm3-x1)
# One host synchronisation (a flag copied to the host: the queue drains, then the host launches the next
# kernels): an estimate, not a measurement, of a round trip and a few kernel launches of microseconds each,
# as illustrative as chapter 8's latencies; make gpu-check measures it (`gpu_check.gemm.host_sync`).
HOST_SYNC_S = 25e-6
# FlashAttention-2 reaches about 35 % of the H100's peak (Shah et al. 2024, FlashAttention-3, abstract).
FLASH_EFFICIENCY = 0.35


def fp8_speedup(d: float, bf16: GemmCurve, fp8: GemmCurve, cast: CastCost) -> float:
    """t_bf16 / t_fp8 of a d x d x d product, the FP8 one with both operands cast (d^2 values each)."""
    return bf16.seconds(d, d, d) / (fp8.seconds(d, d, d) + 2 * cast.seconds(d * d))


@cache
def fallback_cast(gpu: str = "H200") -> CastCost:
    """The cast at the quarter of the HBM roofline measured (`CAST_QUARTER`), its fixed cost fitted to
    `H200_FP8_SPEEDUP` (least squares on the log of the speed-up, both GEMMs at `GEMM_E_MAX`, a grid of
    0.1 µs steps to 100 µs)."""
    p16, p8, w, _ = SPECS[gpu]
    bf16, fp8 = (GemmCurve(GEMM_E_MAX, 0.0, p, ISSUE_35) for p in (p16, p8))

    def error(t0: float) -> float:
        cast = CastCost(CAST_QUARTER, t0, w, ISSUE_35)
        return sum(math.log(fp8_speedup(d, bf16, fp8, cast) / r) ** 2 for d, r in H200_FP8_SPEEDUP)

    t0 = min((i * 1e-7 for i in range(1001)), key=error)
    return CastCost(CAST_QUARTER, t0, w, f"a quarter of the HBM roofline, the fixed cost fitted to the FP8 "
                                         f"speed-ups of {ISSUE_35}")


def fallback(gpu: str) -> KernelRates:
    """The rates of `gpu` where `make gpu-check` measured none (module docstring)."""
    if gpu not in SPECS:
        raise ValueError(f"gpu={gpu!r} has no kernel rates in distlab.kernel_rates.SPECS; choose one of "
                         f"{', '.join(SPECS)}, or measure one with make gpu-check")
    p16, p8, w, src = SPECS[gpu]
    fit = fallback_cast("H200")
    cast = CastCost(fit.hbm_fraction, fit.fixed_s, w, fit.source)
    bf16, fp8 = GemmCurve(GEMM_E_MAX, 0.0, p16, ISSUE_35), GemmCurve(GEMM_E_MAX, 0.0, p8, ISSUE_35)
    return KernelRates(gpu, bf16, fp8, cast, w, H100_COPY_FRACTION, FLASH_EFFICIENCY,
                       f"fallback ({src}; {ISSUE_35})", HOST_SYNC_S)


def from_report(gemm: dict, gpu: str) -> KernelRates:
    """The rates `make gpu-check` measured (`distlab.gpu_check.gemm`: its report's "gemm" section, timed
    bf16 and FP8 products and casts), the fallback's for whatever it did not measure."""
    base = fallback(gpu)
    p16, p8, w, _ = SPECS[gpu]
    where = f"make gpu-check on {gemm.get('device', gpu)}"
    out = base
    if len(gemm.get("bf16", [])) >= 2:
        rows = gemm["bf16"]
        out = replace(out, bf16=GemmCurve.fit([(r["m"], r["n"], r["k"]) for r in rows],
                                              [r["seconds"] for r in rows], p16, where))
    if len(gemm.get("fp8", [])) >= 2:
        rows = gemm["fp8"]
        out = replace(out, fp8=GemmCurve.fit([(r["m"], r["n"], r["k"]) for r in rows],
                                             [r["seconds"] for r in rows], p8, where))
    if len(gemm.get("cast", [])) >= 2:
        rows = gemm["cast"]
        out = replace(out, cast=CastCost.fit([r["values"] for r in rows], [r["seconds"] for r in rows], w,
                                             where))
    if gemm.get("host_sync_seconds"):
        out = replace(out, sync_s=gemm["host_sync_seconds"])
    return replace(out, source=where)
