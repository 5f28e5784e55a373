"""When FP8 pays: the time of one linear layer's matmul in bf16 and in FP8, casts included.

A GEMM of an (M x K) by a (K x N) matrix does 2 M K N FLOPs and moves at least the two operands and the
result through HBM. On a GPU of peak P FLOP/s in the operands' precision and memory bandwidth W bytes/s,
a roofline (Williams, Waterman & Patterson 2009) gives its time as the larger of the two:

    t_gemm(e) = max(2 M K N / P_e, (e (M K + K N) + 2 M N) / W)      e: bytes per operand value

FP8 doubles P (H100 SXM5: 1,979 dense FP8 TFLOP/s against 989 for BF16; NVIDIA 2022, the H100 whitepaper)
and halves e; but the operands arrive in bf16 and must be cast first. A cast with current scaling reads
the bf16 tensor twice (once for its amax, once to scale it) and writes its 1-byte copy: 5 bytes per value,
memory-bound; with delayed scaling, 3. So

    t_fp8 = t_gemm(1) + c (M K + K N) / W,     c = 5 (current) or 3 (delayed; the amax is fused)

and FP8 pays when t_fp8 < t_gemm(2). Small matmuls are memory-bound in both precisions, and there the
casts make FP8 *slower*; large ones approach the 2x of the peak ratio. (In a training step each operand is
cast once per matmul it enters; the model counts the forward GEMM's two operands.) The peaks are data with
their source, both from chapter 8's `distlab.catalog` (through `distlab.kernel_rates.SPECS`): dense, no
sparsity (H100 SXM5: the whitepaper's Table 2, 1,978.9 dense FP8 TFLOP/s; NVIDIA's pages print the
"with sparsity" figures, twice these).

That roofline (`model="roofline"`) is the best case, and measured on an H200 it was 3-4x off: it put the
break-even near d = 2,050, where FP8 ran at 0.18x of bf16, and FP8 paid only from d = 8,192 (issue 35).
Real GEMMs reach a fraction of the peak that depends on their size, and a cast reaches a fraction of the
HBM bandwidth plus a fixed cost. `model="measured"` (the default) therefore prices each piece with
`distlab.kernel_rates`: each GEMM at its `GemmCurve` (bf16 and FP8 each), never faster than the roofline's
memory side, and each cast at its `CastCost`, measured by `make gpu-check` or the stated fallback.
"""

from __future__ import annotations

import math

import numpy as np

from distlab import kernel_rates
from distlab.kernel_rates import KernelRates

# Bytes per value of a cast: read the bf16 value (twice with current scaling: amax, then scale), write 1.
CAST_BYTES = {"current": 5, "delayed": 3}


def _gpu(gpu: str) -> tuple[float, float, float]:
    """Peak bf16 and FP8 FLOP/s and HBM bytes/s (`distlab.kernel_rates.SPECS`, from the catalog)."""
    if gpu not in kernel_rates.SPECS:
        raise ValueError(f"gpu={gpu!r} has no FP8 peak in distlab.kernel_rates.SPECS; choose one of "
                         f"{', '.join(kernel_rates.SPECS)} (earlier GPUs have no FP8 Tensor Cores)")
    p16, p8, w, _ = kernel_rates.SPECS[gpu]
    return p16, p8, w


def gemm_time(m: float, k: float, n: float, value_bytes: float, flops_per_s: float, bytes_per_s: float
              ) -> float:
    """The roofline time of an (m x k) @ (k x n) matmul with `value_bytes` per operand value (output bf16)."""
    return max(2 * m * k * n / flops_per_s, (value_bytes * (m * k + k * n) + 2 * m * n) / bytes_per_s)


MODELS = ("measured", "roofline")


def _check(m: float, k: float, n: float, scaling: str, model: str) -> None:
    if scaling not in CAST_BYTES:
        raise ValueError(f"scaling={scaling!r} is unknown; choose one of {', '.join(CAST_BYTES)}")
    if model not in MODELS:
        raise ValueError(f"model={model!r} is unknown; choose one of {', '.join(MODELS)}")
    for name, v in (("m", m), ("k", k), ("n", n)):
        if not v >= 1:
            raise ValueError(f"{name}={v} must be at least 1 (a matrix dimension)")


def linear_times(m: float, k: float, n: float, gpu: str = "H100", scaling: str = "current",
                 model: str = "measured", rates: KernelRates | None = None) -> dict[str, float]:
    """Seconds of the matmul in bf16, and in FP8 with the cast of both operands (module docstring):
    `model="roofline"` from the peaks, `"measured"` from `rates` (None: `kernel_rates.fallback(gpu)`)."""
    _check(m, k, n, scaling, model)
    p16, p8, w = _gpu(gpu)
    if model == "roofline":
        cast = CAST_BYTES[scaling] * (m * k + k * n) / w
        bf16, fp8 = gemm_time(m, k, n, 2, p16, w), gemm_time(m, k, n, 1, p8, w)
    else:
        r = rates or kernel_rates.fallback(gpu)
        cast = r.cast.seconds(m * k, CAST_BYTES[scaling]) + r.cast.seconds(k * n, CAST_BYTES[scaling])
        bf16 = max(r.bf16.seconds(m, n, k), gemm_time(m, k, n, 2, math.inf, w))
        fp8 = max(r.fp8.seconds(m, n, k), gemm_time(m, k, n, 1, math.inf, w))
    return {"bf16": bf16, "fp8 gemm": fp8, "cast": cast, "fp8": fp8 + cast}


def speedup(m: float, k: float, n: float, gpu: str = "H100", scaling: str = "current",
            model: str = "measured", rates: KernelRates | None = None) -> float:
    """t_bf16 / t_fp8: above 1 FP8 pays, below 1 the casts cost more than the faster GEMM saves."""
    t = linear_times(m, k, n, gpu, scaling, model, rates)
    return t["bf16"] / t["fp8"]


def break_even(gpu: str = "H100", scaling: str = "current", tokens: float | None = None,
               model: str = "measured", rates: KernelRates | None = None) -> float:
    """The smallest square size d (m = k = n = d, or m = `tokens` and k = n = d) at which FP8 pays,
    found on a grid of powers of two to 2^20 and refined by bisection."""
    def f(d: float) -> float:
        return speedup(tokens or d, d, d, gpu, scaling, model, rates) - 1
    grid = 2.0 ** np.arange(0, 21)
    above = [d for d in grid if f(d) > 0]
    if not above:
        raise ValueError(f"FP8 never pays on {gpu} for these shapes up to 2^20")
    hi = above[0]
    lo = hi / 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if f(mid) > 0 else (mid, hi)
    return hi
