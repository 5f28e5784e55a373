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
their source: BF16 from `distlab.catalog`, FP8 from `FP8_DENSE_TFLOPS` here.
"""

from __future__ import annotations

import numpy as np

from distlab import catalog

# Peak dense FP8 Tensor Core TFLOP/s, no sparsity (the sparse figure is twice this). H100 SXM5: NVIDIA
# H100 Tensor Core GPU Architecture whitepaper (nvidia2022hopper), Table 2: 1,978.9 dense FP8 (3,957.8
# with sparsity); the datasheet (nvidia2023h100) prints "3,958 teraFLOPS*" with "* with sparsity".
FP8_DENSE_TFLOPS = {"H100": (1978.9, "nvidia2022hopper")}

# Bytes per value of a cast: read the bf16 value (twice with current scaling: amax, then scale), write 1.
CAST_BYTES = {"current": 5, "delayed": 3}


def _gpu(gpu: str) -> tuple[float, float, float]:
    if gpu not in FP8_DENSE_TFLOPS:
        raise ValueError(f"gpu={gpu!r} has no FP8 peak in FP8_DENSE_TFLOPS; choose one of "
                         f"{', '.join(FP8_DENSE_TFLOPS)} (earlier GPUs have no FP8 Tensor Cores)")
    row = catalog.lookup("gpu", gpu)
    return row.dense_16bit_tflops * 1e12, FP8_DENSE_TFLOPS[gpu][0] * 1e12, row.memory_GBps * 1e9


def gemm_time(m: float, k: float, n: float, value_bytes: float, flops_per_s: float, bytes_per_s: float
              ) -> float:
    """The roofline time of an (m x k) @ (k x n) matmul with `value_bytes` per operand value (output bf16)."""
    return max(2 * m * k * n / flops_per_s, (value_bytes * (m * k + k * n) + 2 * m * n) / bytes_per_s)


def linear_times(m: float, k: float, n: float, gpu: str = "H100", scaling: str = "current"
                 ) -> dict[str, float]:
    """Seconds of the matmul in bf16, and in FP8 with the cast of both operands (module docstring)."""
    if scaling not in CAST_BYTES:
        raise ValueError(f"scaling={scaling!r} is unknown; choose one of {', '.join(CAST_BYTES)}")
    for name, v in (("m", m), ("k", k), ("n", n)):
        if not v >= 1:
            raise ValueError(f"{name}={v} must be at least 1 (a matrix dimension)")
    p16, p8, w = _gpu(gpu)
    cast = CAST_BYTES[scaling] * (m * k + k * n) / w
    return {"bf16": gemm_time(m, k, n, 2, p16, w), "fp8 gemm": gemm_time(m, k, n, 1, p8, w), "cast": cast,
            "fp8": gemm_time(m, k, n, 1, p8, w) + cast}


def speedup(m: float, k: float, n: float, gpu: str = "H100", scaling: str = "current") -> float:
    """t_bf16 / t_fp8: above 1 FP8 pays, below 1 the casts cost more than the faster GEMM saves."""
    t = linear_times(m, k, n, gpu, scaling)
    return t["bf16"] / t["fp8"]


def break_even(gpu: str = "H100", scaling: str = "current", tokens: float | None = None) -> float:
    """The smallest square size d (m = k = n = d, or m = `tokens` and k = n = d) at which FP8 pays,
    found on a grid of powers of two to 2^20 and refined by bisection."""
    def f(d: float) -> float:
        return speedup(tokens or d, d, d, gpu, scaling) - 1
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
