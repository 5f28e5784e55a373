"""The alpha-beta-gamma cost model of collective communication, and fitting it to this machine.

Sending one message of n bytes costs alpha + n*beta (Hockney 1994, "The communication challenge for
MPP: Intel Paragon and Meiko CS-2", Parallel Computing 20(3)); reducing n bytes costs n*gamma.
An algorithm's time is the sum over the steps on its critical path. The formulas below are those of
Thakur, Rabenseifner & Gropp 2005 ("Optimization of collective communication operations in MPICH",
Int. J. High Perf. Comput. Appl. 19(1)) and Chan, Heimlich, Purkayastha & van de Geijn 2007
("Collective communication: theory, practice, and experience", Concurrency Computat.: Pract. Exper.
19(13)), each checked against the implementation in `distlab.collectives.algorithms`: where the code
does something different from the paper, the formula models the code and its docstring says so.

Sizes: `n` is always the size in bytes of the *whole* vector the collective is about -- the vector
being reduced (all-reduce, reduce, reduce-scatter input), broadcast, or gathered (all-gather output,
the root's buffer of scatter and gather), and one rank's whole send buffer for all-to-all. This is the
convention of nccl-tests (doc/PERFORMANCE.md), so predicted and measured rows line up.

Every function is vectorised over `n` (a number or a numpy array) and returns seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray


@dataclass(frozen=True)
class MachineParams:
    """Machine parameters of the alpha-beta-gamma model (Hockney 1994; Chan et al. 2007, sec. 2).

    alpha: seconds per message (latency); beta: seconds per byte sent (1/bandwidth);
    gamma: seconds per byte reduced (1/reduction throughput).
    """

    alpha: float
    beta: float
    gamma: float = 0.0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "gamma"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"MachineParams.{name}={value!r} must be a finite number >= 0 (seconds"
                                 f"{' per message' if name == 'alpha' else ' per byte'}), e.g. 1e-5")

    @property
    def bandwidth_GBps(self) -> float:  # noqa: N802 (units in the name, as nccl-tests writes them)
        """1/beta in GB/s (1 GB = 1e9 bytes, as nccl-tests counts)."""
        return math.inf if self.beta == 0 else 1e-9 / self.beta

    @property
    def reduce_GBps(self) -> float:  # noqa: N802
        """1/gamma in GB/s."""
        return math.inf if self.gamma == 0 else 1e-9 / self.gamma

    def __repr__(self) -> str:
        return (f"MachineParams(alpha={self.alpha * 1e6:.3g} µs, beta=1/({self.bandwidth_GBps:.3g} GB/s), "
                f"gamma=1/({self.reduce_GBps:.3g} GB/s))")


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------

def _check_p(p: int, name: str = "p") -> int:
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"{name}={p!r} must be a positive integer number of ranks, e.g. {name}=4")
    return int(p)


def _bytes(n: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(n, dtype=np.float64)
    if np.any(~np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"nbytes={n!r} must be sizes in bytes >= 0; pass e.g. np.logspace(2, 8) or 4 << 20")
    return arr


def _out(t: NDArray[np.float64]) -> NDArray[np.float64] | float:
    return float(t) if t.ndim == 0 else t


def ceil_log2(p: int) -> int:
    """Number of rounds of a binomial tree or of recursive doubling on p ranks: ceil(log2 p)."""
    return (_check_p(p) - 1).bit_length()


# --------------------------------------------------------------------------------------------------
# Predicted time of each algorithm (seconds)
# --------------------------------------------------------------------------------------------------

def ring_reduce_scatter_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Ring reduce-scatter: (p-1) steps, each sending and reducing one chunk of n/p bytes.

    T = (p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma (Thakur et al. 2005, sec. 4.5; Patarasuk &
    Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2)).
    """
    p, n = _check_p(p), _bytes(n)
    return _out((p - 1) * m.alpha + (p - 1) / p * n * (m.beta + m.gamma))


def ring_all_gather_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Ring all-gather of an n-byte result: (p-1) alpha + (p-1)/p n beta (Thakur et al. 2005, sec. 4.1)."""
    p, n = _check_p(p), _bytes(n)
    return _out((p - 1) * m.alpha + (p - 1) / p * n * m.beta)


def ring_all_reduce_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Ring all-reduce = ring reduce-scatter + ring all-gather (Patarasuk & Yuan 2009).

    T = 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma: bandwidth optimal, latency linear in p.
    """
    return _out(np.asarray(ring_reduce_scatter_time(n, p, m)) + np.asarray(ring_all_gather_time(n, p, m)))


def recursive_doubling_all_reduce_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Recursive-doubling all-reduce: log2 p' rounds exchanging the whole vector (p' = 2^floor(log2 p)).

    T = log2(p') (alpha + n beta + n gamma) for p = p'. When p is not a power of two, the p - p'
    extra ranks first send their vector to a partner, which reduces it (alpha + n beta + n gamma), and
    get the result back at the end (alpha + n beta) (Thakur et al. 2005, sec. 4.4).
    """
    p, n = _check_p(p), _bytes(n)
    rounds = p.bit_length() - 1  # floor(log2 p)
    t = rounds * (m.alpha + n * (m.beta + m.gamma))
    if p & (p - 1):  # not a power of two: fold in, fold out
        t = t + (m.alpha + n * (m.beta + m.gamma)) + (m.alpha + n * m.beta)
    return _out(t)


def tree_broadcast_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Binomial-tree broadcast: ceil(log2 p) (alpha + n beta) (Thakur et al. 2005, sec. 4.2)."""
    p, n = _check_p(p), _bytes(n)
    return _out(ceil_log2(p) * (m.alpha + n * m.beta))


def tree_reduce_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Binomial-tree reduce: ceil(log2 p) (alpha + n beta + n gamma) (Thakur et al. 2005, sec. 4.6)."""
    p, n = _check_p(p), _bytes(n)
    return _out(ceil_log2(p) * (m.alpha + n * (m.beta + m.gamma)))


def tree_scatter_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Binomial-tree scatter of the root's n bytes: ceil(log2 p) alpha + (p-1)/p n beta.

    Each round halves what is forwarded (Thakur et al. 2005, sec. 4.3; Chan et al. 2007, sec. 4).
    """
    p, n = _check_p(p), _bytes(n)
    return _out(ceil_log2(p) * m.alpha + (p - 1) / p * n * m.beta)


def tree_gather_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Binomial-tree gather to the root's n bytes: the scatter run backwards, same cost."""
    return tree_scatter_time(n, p, m)


def pairwise_all_to_all_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Pairwise-exchange all-to-all, n = one rank's whole send buffer: (p-1) alpha + (p-1)/p n beta.

    In step k each rank sends its block for rank (r+k) mod p (Thakur et al. 2005, sec. 4.7).
    """
    p, n = _check_p(p), _bytes(n)
    return _out((p - 1) * m.alpha + (p - 1) / p * n * m.beta)


def hierarchical_all_reduce_time(n: ArrayLike, p: int, m: MachineParams, ranks_per_node: int,
                                 inter: MachineParams | None = None) -> NDArray[np.float64] | float:
    """Two-level all-reduce on p = nodes x ranks_per_node ranks, the sum of its three phases.

    1. ring reduce-scatter inside each node (q = ranks_per_node ranks, intra-node parameters `m`);
    2. ring all-reduce of each n/q-byte shard across the nodes (p/q ranks, inter-node `inter`);
    3. ring all-gather inside each node (intra-node parameters).
    """
    p, q = _check_p(p), _check_p(ranks_per_node, "ranks_per_node")
    if p % q:
        raise ValueError(f"ranks_per_node={q} does not divide p={p}; choose a divisor of {p}")
    inter = m if inter is None else inter
    n = _bytes(n)
    intra_phases = np.asarray(ring_reduce_scatter_time(n, q, m)) + np.asarray(ring_all_gather_time(n, q, m))
    return _out(intra_phases + np.asarray(ring_all_reduce_time(n / q, p // q, inter)))


def all_reduce_lower_bound(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Lower bound on any all-reduce: ceil(log2 p) alpha + 2(p-1)/p n beta + (p-1)/p n gamma.

    Each term is a separate lower bound (Chan et al. 2007, table 1): information must reach every rank
    (log2 p rounds); each rank must send and receive 2(p-1)/p n bytes (Patarasuk & Yuan 2009, sec. 3);
    the (p-1) n bytes of additions are shared by p ranks. No algorithm attains all three at once.
    """
    p, n = _check_p(p), _bytes(n)
    return _out(ceil_log2(p) * m.alpha + (p - 1) / p * n * (2 * m.beta + m.gamma))


def all_reduce_bandwidth_bound(p: int, m: MachineParams) -> float:
    """Highest all-reduce algorithm bandwidth (bytes/s) any algorithm can reach: p / (2(p-1) beta).

    Equivalently, bus bandwidth (nccl-tests' busbw = algbw * 2(p-1)/p) can never exceed 1/beta.
    """
    p = _check_p(p)
    if p == 1 or m.beta == 0:
        return math.inf
    return p / (2 * (p - 1) * m.beta)


COST_MODELS: dict[str, Callable[..., NDArray[np.float64] | float]] = {
    "ring_all_reduce": ring_all_reduce_time,
    "ring_reduce_scatter": ring_reduce_scatter_time,
    "ring_all_gather": ring_all_gather_time,
    "recursive_doubling_all_reduce": recursive_doubling_all_reduce_time,
    "tree_broadcast": tree_broadcast_time,
    "tree_reduce": tree_reduce_time,
    "hierarchical_all_reduce": hierarchical_all_reduce_time,
    "pairwise_all_to_all": pairwise_all_to_all_time,
    "scatter": tree_scatter_time,
    "gather": tree_gather_time,
}


def predict(algorithm: str, nbytes: ArrayLike, p: int, params: MachineParams, *,
            ranks_per_node: int | None = None, inter: MachineParams | None = None
            ) -> NDArray[np.float64] | float:
    """Predicted seconds for `algorithm` (a name in ALGORITHMS) on `p` ranks, vectorised over `nbytes`.

    `ranks_per_node` and `inter` (inter-node parameters; default `params`) are for
    "hierarchical_all_reduce" only.
    """
    if algorithm not in COST_MODELS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(sorted(COST_MODELS))}")
    if algorithm == "hierarchical_all_reduce":
        if ranks_per_node is None:
            raise ValueError("algorithm='hierarchical_all_reduce' needs ranks_per_node=...: pass the "
                             "number of ranks on one node, a divisor of p")
        return hierarchical_all_reduce_time(nbytes, p, params, ranks_per_node, inter)
    if ranks_per_node is not None or inter is not None:
        raise ValueError(f"ranks_per_node and inter apply only to 'hierarchical_all_reduce', not to "
                         f"{algorithm!r}; drop them")
    return COST_MODELS[algorithm](nbytes, p, params)


# --------------------------------------------------------------------------------------------------
# Fitting alpha, beta and gamma to this machine
# --------------------------------------------------------------------------------------------------

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
    """Inside a rank: one-way time of an n-byte message between ranks 0 and 1, for each size.

    Rank 0 sends, rank 1 sends it back; one-way time = round trip / 2, averaged over a number of round
    trips that shrinks with size, median over `repeats`. Other ranks only wait. Returns seconds per size
    (on every rank; only ranks 0 and 1 measure, the others return the same list received from rank 0).
    """
    import time

    import torch
    import torch.distributed as dist

    from distlab import launch

    me, dev = launch.rank(), launch.device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out = []
    for n in sizes:
        buf = torch.zeros(n, dtype=torch.uint8, device=dev)
        trips = int(np.clip((1 << 22) // max(n, 1), 2, 50))
        samples = []
        for _ in range(repeats + 1):  # the first repeat is a warm-up
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            for _ in range(trips):
                if me == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                elif me == 1:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
            sync()
            samples.append((time.perf_counter() - t0) / (2 * trips))
        out.append(float(np.median(samples[1:])))
    result = torch.tensor(out, dtype=torch.float64, device=dev)
    dist.broadcast(result, 0)
    return result.tolist()


def measure_gamma(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Seconds per byte of `a.add_(b)` on float32 buffers of `nbytes` (this process, its device)."""
    import time

    import torch

    dev = torch.device("cpu")
    try:
        from distlab import launch

        dev = launch.device()
    except RuntimeError:  # no process group: measure on the CPU
        pass
    a = torch.zeros(nbytes // 4, device=dev)
    b = torch.ones_like(a)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    samples = []
    for _ in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        a.add_(b)
        sync()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples[1:])) / (a.numel() * 4)


def _measure(sizes: tuple[int, ...], repeats: int, gamma_bytes: int) -> tuple[list[float], float]:
    times = ping_pong(sizes, repeats)
    from distlab import launch

    gamma = measure_gamma(gamma_bytes, repeats) if launch.rank() == 0 else 0.0
    return times, gamma


def fit_machine(sizes: tuple[int, ...] = PING_PONG_SIZES, repeats: int = 5, gamma_bytes: int = 64 << 20,
                backend: str = "auto", timeout: float = 120.0) -> MachineFit:
    """Measure ping-pong on 2 ranks and add_ throughput, and fit MachineParams to them (one launch)."""
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"sizes={sizes!r} must hold at least two sizes >= 1 byte, e.g. (4, 4096, 4 << 20)")
    if repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be >= 1 (the median is taken over repeats), e.g. 5")
    from distlab import launch

    times, gamma = launch.run(_measure, 2, sizes, repeats, gamma_bytes, backend=backend, timeout=timeout)[0]
    n, t = np.asarray(sizes, dtype=np.float64), np.asarray(times)
    alpha, beta = fit_alpha_beta(n, t)
    fitted = alpha + beta * n
    return MachineFit(MachineParams(alpha, beta, gamma), n, t, fitted, fitted / t - 1, gamma_bytes,
                      gamma * gamma_bytes)
