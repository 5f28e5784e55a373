"""Fitting the alpha-beta-gamma model to this machine: ping-pong for alpha and beta, add_ for gamma.

alpha + n*beta is the time of one n-byte message (Hockney 1994, "The communication challenge for MPP:
Intel Paragon and Meiko CS-2", Parallel Computing 20(3)); `ping_pong` times it between two ranks, as
Hockney's ping-pong does, and `fit_alpha_beta` fits the line with equal weight on every size. gamma, the
seconds per byte reduced, is the time of a float32 add_. `fit_machine` does all of it in one launch and
returns the `MachineParams` that `cost_model.predict` takes (also importable as
`distlab.collectives.fit_machine`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from numpy.typing import ArrayLike, NDArray

from distlab import launch, staged_p2p
from distlab.collectives.cost_model import MachineParams

PING_PONG_SIZES: tuple[int, ...] = tuple(4 * 4**k for k in range(13))  # 4 B, 16 B, ..., 64 MiB


@dataclass(frozen=True)
class MachineFit:
    """Fitted parameters and the measurements behind them, for a measured-vs-fitted plot.

    sizes (bytes) and times (one-way seconds, median over repeats) are the ping-pong points; fitted is
    alpha + beta * sizes; rel_error = fitted / times - 1. gamma_bytes and gamma_time are the add_ timing.
    """

    params: MachineParams
    sizes: NDArray[np.float64]
    times: NDArray[np.float64]
    fitted: NDArray[np.float64]
    rel_error: NDArray[np.float64]
    gamma_bytes: int = 0
    gamma_time: float = 0.0

    @property
    def rms_rel_error(self) -> float:
        """Root-mean-square relative error of the fit over all sizes (0.1 = 10 %)."""
        return float(np.sqrt(np.mean(self.rel_error**2)))

    @property
    def max_rel_error(self) -> float:
        """Largest relative error of the fit at any size."""
        return float(np.max(np.abs(self.rel_error)))

    def __repr__(self) -> str:
        return (f"MachineFit({self.params!r}, {len(self.sizes)} sizes {int(self.sizes[0])} B .. "
                f"{int(self.sizes[-1])} B, rms relative error {self.rms_rel_error:.1%}, "
                f"max {self.max_rel_error:.1%})")


def fit_alpha_beta(sizes: ArrayLike, times: ArrayLike) -> tuple[float, float]:
    """Least-squares fit of t = alpha + beta * n that minimises the *relative* error at each size.

    Ordinary least squares on sizes spanning 4 B .. 64 MB is dominated by the largest messages, and the
    latency alpha comes out as noise (often negative). Dividing each equation by its measured t makes
    every size count alike: minimise sum_i ((alpha + beta n_i) / t_i - 1)^2. If alpha still comes out
    negative it is pinned to 0 and beta refitted; likewise beta. Returns (alpha, beta) in s and s/byte.
    """
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if n.shape != t.shape or n.ndim != 1 or len(n) < 2:
        raise ValueError(f"sizes and times must be 1-D and of equal length >= 2; got shapes {n.shape} and "
                         f"{t.shape}: pass one time per size, for at least two sizes")
    if np.any(n < 0) or np.any(t <= 0) or not (np.all(np.isfinite(n)) and np.all(np.isfinite(t))):
        raise ValueError("sizes must be >= 0 bytes and times > 0 seconds, all finite; drop the bad points")
    a = np.stack([1 / t, n / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:  # one-parameter fit t = beta n
        alpha, beta = 0.0, float(np.sum(n / t) / np.sum((n / t) ** 2))
    if beta < 0:  # one-parameter fit t = alpha
        alpha, beta = float(np.sum(1 / t) / np.sum(1 / t**2)), 0.0
    return float(alpha), float(beta)


def ping_pong(sizes: tuple[int, ...] = PING_PONG_SIZES, repeats: int = 5) -> list[float]:
    """Inside a rank: one-way seconds for an n-byte message between ranks 0 and 1, for each size.

    Rank 0 sends, rank 1 sends it back: one-way = round trip / 2, averaged over more round trips for
    small sizes, median over `repeats` (after one warm-up). Other ranks wait. Every rank returns the list.
    """
    me, dev = launch.rank(), launch.device()
    out = []
    for n in sizes:
        buf = torch.zeros(n, dtype=torch.uint8, device=dev)
        trips = int(np.clip((1 << 22) // n, 2, 50))
        samples = []
        for _ in range(repeats + 1):
            dist.barrier()
            _sync(dev)
            t0 = time.perf_counter()
            for _ in range(trips):
                if me == 0:
                    staged_p2p.send(buf, group_dst=1)
                    staged_p2p.recv(buf, group_src=1)
                elif me == 1:
                    staged_p2p.recv(buf, group_src=0)
                    staged_p2p.send(buf, group_dst=0)
            _sync(dev)
            samples.append((time.perf_counter() - t0) / (2 * trips))
        out.append(float(np.median(samples[1:])))
    result = torch.tensor(out, dtype=torch.float64, device=dev)
    dist.broadcast(result, 0)
    return result.tolist()


def measure_gamma(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Seconds per byte of `a.add_(b)` on float32 buffers of `nbytes`, on this rank's device (or CPU)."""
    dev = launch.device() if dist.is_initialized() else torch.device("cpu")
    a = torch.zeros(nbytes // 4, device=dev)
    b = torch.ones_like(a)
    samples = []
    for _ in range(repeats + 1):
        _sync(dev)
        t0 = time.perf_counter()
        a.add_(b)
        _sync(dev)
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples[1:])) / (a.numel() * 4)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _measure(sizes: tuple[int, ...], repeats: int, gamma_bytes: int) -> tuple[list[float], float]:
    times = ping_pong(sizes, repeats)
    return times, measure_gamma(gamma_bytes, repeats) if launch.rank() == 0 else 0.0


def fit_machine(sizes: tuple[int, ...] = PING_PONG_SIZES, repeats: int = 5, gamma_bytes: int = 64 << 20,
                backend: str = "auto", timeout: float = 120.0) -> MachineFit:
    """Measure ping-pong on 2 ranks and add_ throughput, and fit MachineParams to them (one launch)."""
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"sizes={sizes!r} must hold at least two sizes >= 1 byte, e.g. (4, 4096, 4 << 20)")
    if repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be >= 1 (the median is taken over repeats), e.g. 5")
    times, gamma = launch.run(_measure, 2, sizes, repeats, gamma_bytes, backend=backend, timeout=timeout)[0]
    n, t = np.asarray(sizes, dtype=np.float64), np.asarray(times)
    alpha, beta = fit_alpha_beta(n, t)
    fitted = alpha + beta * n
    return MachineFit(MachineParams(alpha, beta, gamma), n, t, fitted, fitted / t - 1, gamma_bytes,
                      gamma * gamma_bytes)
