"""The alpha-beta-gamma cost model of collective communication: what each algorithm should cost.

Sending one message of n bytes costs alpha + n*beta (Hockney 1994, "The communication challenge for
MPP: Intel Paragon and Meiko CS-2", Parallel Computing 20(3)); reducing n bytes costs n*gamma.
An algorithm's time is the sum over the steps on its critical path. The formulas below are those of
Thakur, Rabenseifner & Gropp 2005 ("Optimization of collective communication operations in MPICH",
Int. J. High Perf. Comput. Appl. 19(1)) and Chan, Heimlich, Purkayastha & van de Geijn 2007
("Collective communication: theory, practice, and experience", Concurrency Computat.: Pract. Exper.
19(13)), each checked against the implementation in `distlab.collectives`: where the code does
something different from the paper, the formula models the code and its docstring says so. The
functions give the papers' formulas by default; pass `segmenting=` (a `Segmenting`, the value the
algorithm runs with) for the cost of the segmented implementation. `predict` does that for you.

Sizes: `n` is always the size in bytes of the *whole* vector the collective is about -- the vector
being reduced (all-reduce, reduce, reduce-scatter input), broadcast, or gathered (all-gather output,
the root's buffer of scatter and gather), and one rank's whole send buffer for all-to-all. This is the
convention of nccl-tests (doc/PERFORMANCE.md), so predicted and measured rows line up.

Every function is vectorised over `n` (a number or a numpy array) and returns seconds. Measuring
alpha, beta and gamma on this machine is the job of `fit` (`fit_machine`). This file imports only the
standard library and numpy: no torch, no processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from distlab.collectives.segmenting import DEFAULT, Segmenting


@dataclass(frozen=True)
class MachineParams:
    """Machine parameters of the alpha-beta-gamma model (Hockney 1994; Chan et al. 2007).

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
    def bandwidth_GBps(self) -> float:
        """1/beta in GB/s (1 GB = 1e9 bytes, as nccl-tests counts)."""
        return math.inf if self.beta == 0 else 1e-9 / self.beta

    @property
    def reduce_GBps(self) -> float:
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


def _scalar_bytes(n: ArrayLike) -> float | None:
    """`n` as a float when it is one number (int or float): the fast path of the ring formulas, which the
    planner calls millions of times; None for arrays. A ValueError for a size that is not >= 0 and finite."""
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return None
    if not 0 <= n < math.inf:
        raise ValueError(f"nbytes={n!r} must be sizes in bytes >= 0; pass e.g. np.logspace(2, 8) or 4 << 20")
    return float(n)


def _out(t: ArrayLike) -> NDArray[np.float64] | float:
    t = np.asarray(t, dtype=np.float64)
    return float(t) if t.ndim == 0 else t


def ceil_log2(p: int) -> int:
    """Rounds of a binomial tree on p ranks: ceil(log2 p)."""
    return (_check_p(p) - 1).bit_length()


# --------------------------------------------------------------------------------------------------
# Predicted time of each algorithm (seconds), as implemented in distlab.collectives
# --------------------------------------------------------------------------------------------------

def segments_per_chunk(chunk: ArrayLike, segmenting: Segmenting) -> NDArray[np.float64]:
    """How many segments the segmented ring cuts a chunk of `chunk` bytes into (segmented_ring.py):
    ceil(chunk / segment_bytes), at least 2 once the chunk holds two min_segment_bytes, at least 1."""
    c = np.asarray(chunk, dtype=np.float64)
    least = np.where(c >= 2 * segmenting.min_segment_bytes, 2.0, 1.0)
    return np.maximum(np.ceil(c / segmenting.segment_bytes), least)


def ring_reduce_scatter_time(n: ArrayLike, p: int, m: MachineParams, segmenting: Segmenting | None = None
                             ) -> NDArray[np.float64] | float:
    """Ring reduce-scatter: p-1 steps, each sending one chunk of n/p bytes and reducing the one received.

    Textbook (segmenting=None): (p-1) alpha + (p-1)/p n (beta + gamma) (Thakur et al. 2005;
    Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
    JPDC 69(2)). As implemented (segmented_ring.py), a chunk c = n/p travels as k messages
    (segments_per_chunk), and each segment is reduced while the next is still arriving, so a step costs
    k alpha + c max(beta, gamma) + (c / k) min(beta, gamma): only the last segment's work is not hidden.
    """
    one = _scalar_bytes(n) if segmenting is None else None
    if one is not None:  # the same formula on one float: the same result, without numpy
        p = _check_p(p)
        return (p - 1) * (m.alpha + one / p * (m.beta + m.gamma))
    p, n = _check_p(p), _bytes(n)
    chunk = n / p
    if segmenting is None:
        return _out((p - 1) * (m.alpha + chunk * (m.beta + m.gamma)))
    k = segments_per_chunk(chunk, segmenting)
    step = k * m.alpha + chunk * max(m.beta, m.gamma) + chunk / k * min(m.beta, m.gamma)
    return _out((p - 1) * step)


def ring_all_gather_time(n: ArrayLike, p: int, m: MachineParams, segmenting: Segmenting | None = None
                         ) -> NDArray[np.float64] | float:
    """Ring all-gather of an n-byte result: (p-1) alpha + (p-1)/p n beta (Thakur et al. 2005).

    As implemented (segmented_ring.py), each step's block goes as k segments (segments_per_chunk):
    k alpha per step instead of one.
    """
    one = _scalar_bytes(n) if segmenting is None else None
    if one is not None:
        p = _check_p(p)
        return (p - 1) * (m.alpha + one / p * m.beta)
    p, n = _check_p(p), _bytes(n)
    k = 1.0 if segmenting is None else segments_per_chunk(n / p, segmenting)
    return _out((p - 1) * (k * m.alpha + n / p * m.beta))


def ring_all_reduce_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """The textbook ring all-reduce (ring.py): 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
    (Patarasuk & Yuan 2009) -- bandwidth optimal, latency linear in p. One whole chunk per step, as
    implemented. The course's one ring all-reduce time: the planner calls it on one float (a fast path,
    no numpy), chapter 8 on each hop of a ring through a topology (`hardware.cost_model`).
    """
    if _scalar_bytes(n) is not None:
        return ring_reduce_scatter_time(n, p, m) + ring_all_gather_time(n, p, m)
    return _out(np.add(ring_reduce_scatter_time(n, p, m), ring_all_gather_time(n, p, m)))


def segmented_ring_all_reduce_time(n: ArrayLike, p: int, m: MachineParams,
                                   segmenting: Segmenting | None = DEFAULT) -> NDArray[np.float64] | float:
    """The segmented ring all-reduce (segmented_ring.py): its reduce-scatter and its all-gather, each
    with chunks cut as `segmenting` says (see ring_reduce_scatter_time). None gives the textbook ring."""
    return _out(np.add(ring_reduce_scatter_time(n, p, m, segmenting),
                       ring_all_gather_time(n, p, m, segmenting)))


def recursive_doubling_all_reduce_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Recursive doubling: log2 p' exchanges of the whole vector, p' = 2^floor(log2 p) (Thakur et al.
    2005): log2(p') (alpha + n beta + n gamma).

    When p is not a power of two, p - p' ranks first fold their vector into a partner, which reduces it
    (alpha + n beta + n gamma), and get the result back at the end (alpha + n beta). As implemented.
    """
    p, n = _check_p(p), _bytes(n)
    t = (p.bit_length() - 1) * (m.alpha + n * (m.beta + m.gamma))
    if p & (p - 1):
        t = t + (m.alpha + n * (m.beta + m.gamma)) + (m.alpha + n * m.beta)
    return _out(t)


def tree_broadcast_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Binomial-tree broadcast: ceil(log2 p) (alpha + n beta) (Thakur et al. 2005)."""
    p, n = _check_p(p), _bytes(n)
    return _out(ceil_log2(p) * (m.alpha + n * m.beta))


def tree_reduce_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Binomial-tree reduce: ceil(log2 p) (alpha + n beta + n gamma) (Thakur et al. 2005)."""
    p, n = _check_p(p), _bytes(n)
    return _out(ceil_log2(p) * (m.alpha + n * (m.beta + m.gamma)))


def tree_gather_time(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Binomial-tree gather of n bytes in all to the root: ceil(log2 p) alpha + (p-1)/p n beta.

    Every round halves the number of senders and doubles the blocks (Thakur et al. 2005; Chan
    et al. 2007); all (p-1)/p n bytes enter the root one after the other.
    """
    p, n = _check_p(p), _bytes(n)
    return _out(ceil_log2(p) * m.alpha + (p - 1) / p * n * m.beta)


def tree_scatter_time(n: ArrayLike, p: int, m: MachineParams, headers: bool = True
                      ) -> NDArray[np.float64] | float:
    """Binomial-tree scatter of the root's n bytes: the gather run backwards, plus one shape header.

    Textbook (headers=False): ceil(log2 p) alpha + (p-1)/p n beta. As implemented (trees.py),
    each block is preceded by a small header carrying its shape and dtype: one more alpha per round.
    """
    p = _check_p(p)
    return _out(np.add(tree_gather_time(n, p, m), ceil_log2(p) * m.alpha if headers else 0.0))


def pairwise_all_to_all_time(n: ArrayLike, p: int, m: MachineParams, headers: bool = True
                             ) -> NDArray[np.float64] | float:
    """Pairwise-exchange all-to-all, n = one rank's whole send buffer (Thakur et al. 2005).

    Textbook (headers=False): (p-1) alpha + (p-1)/p n beta; step k sends to rank + k. As implemented
    without output_split_sizes, each step also sends a one-number size header: (p-1) more alpha.
    """
    p, n = _check_p(p), _bytes(n)
    return _out((p - 1) * (m.alpha * (2 if headers else 1) + n / p * m.beta))


def hierarchical_all_reduce_time(n: ArrayLike, p: int, m: MachineParams, ranks_per_node: int,
                                 inter: MachineParams | None = None,
                                 segmenting: Segmenting | None = None) -> NDArray[np.float64] | float:
    """Two-level all-reduce, the sum of its three phases as implemented (all_reduce.py):

    1. binomial-tree reduce to each node's leader (q = ranks_per_node ranks, intra-node parameters m);
    2. segmented ring all-reduce of the whole n bytes among the ceil(p/q) leaders (inter-node
       parameters `inter`, default m; segmenting=None: the textbook ring);
    3. binomial-tree broadcast from the leader inside each node.
    A last node with fewer ranks is never slower than a full one, so it does not change the total.
    """
    p, q = _check_p(p), _check_p(ranks_per_node, "ranks_per_node")
    inter = m if inter is None else inter
    q = min(q, p)
    intra = np.add(tree_reduce_time(n, q, m), tree_broadcast_time(n, q, m))
    return _out(intra + segmented_ring_all_reduce_time(n, -(-p // q), inter, segmenting))


def all_reduce_lower_bound(n: ArrayLike, p: int, m: MachineParams) -> NDArray[np.float64] | float:
    """Lower bound on any all-reduce: ceil(log2 p) alpha + max(2(p-1)/p n beta, (p-1)/p n gamma).

    Information must reach every rank (log2 p rounds of messages); each rank must send and receive
    2(p-1)/p n bytes (Patarasuk & Yuan 2009); (p-1) n bytes of additions are shared by p ranks
    (Chan et al. 2007). Adding the last two terms would assume that reducing never overlaps sending;
    the ring here reduces one segment while the next arrives, so only the larger one is a safe bound.
    """
    p, n = _check_p(p), _bytes(n)
    return _out(ceil_log2(p) * m.alpha + (p - 1) / p * n * max(2 * m.beta, m.gamma))


def all_reduce_bandwidth_bound(p: int, m: MachineParams) -> float:
    """Highest all-reduce algorithm bandwidth (bytes/s) any algorithm can reach: p / (2(p-1) beta).

    Equivalently, bus bandwidth (nccl-tests' busbw = algbw * 2(p-1)/p) can never exceed 1/beta.
    """
    p = _check_p(p)
    return math.inf if p == 1 or m.beta == 0 else p / (2 * (p - 1) * m.beta)


COST_MODELS: dict[str, Callable[..., NDArray[np.float64] | float]] = {
    "ring_all_reduce": ring_all_reduce_time,
    "segmented_ring_all_reduce": segmented_ring_all_reduce_time,
    "recursive_doubling_all_reduce": recursive_doubling_all_reduce_time,
    "hierarchical_all_reduce": hierarchical_all_reduce_time,
    "ring_reduce_scatter": ring_reduce_scatter_time,
    "ring_all_gather": ring_all_gather_time,
    "tree_broadcast": tree_broadcast_time,
    "tree_reduce": tree_reduce_time,
    "tree_scatter": tree_scatter_time,
    "tree_gather": tree_gather_time,
    "pairwise_all_to_all": pairwise_all_to_all_time,
}
_SEGMENTED = ("segmented_ring_all_reduce", "ring_reduce_scatter", "ring_all_gather")
_HEADERS = ("tree_scatter", "pairwise_all_to_all")


def predict(algorithm: str, nbytes: ArrayLike, p: int, params: MachineParams, *,
            ranks_per_node: int | None = None, inter: MachineParams | None = None,
            textbook: bool = False, segmenting: Segmenting = DEFAULT) -> NDArray[np.float64] | float:
    """Predicted seconds for `algorithm` (a name in ALGORITHMS) on `p` ranks, vectorised over `nbytes`.

    `ranks_per_node` and `inter` (inter-node parameters; default `params`) are for
    "hierarchical_all_reduce" only. `segmenting` is what the segmented algorithms run with (pass the
    same value as to the algorithm). textbook=True drops what the implementation adds to the papers'
    formulas (segmenting the ring's messages, size headers), for comparison.
    """
    if algorithm not in COST_MODELS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(COST_MODELS)}")
    if not isinstance(segmenting, Segmenting):
        raise ValueError(f"segmenting={segmenting!r} must be a Segmenting, e.g. Segmenting(segment_bytes="
                         "1 << 20); leave it out for segmenting.DEFAULT")
    chosen = None if textbook else segmenting
    if algorithm == "hierarchical_all_reduce":
        if ranks_per_node is None:
            raise ValueError("algorithm='hierarchical_all_reduce' needs ranks_per_node=...: pass the "
                             "number of ranks on one node, e.g. ranks_per_node=2")
        return hierarchical_all_reduce_time(nbytes, p, params, ranks_per_node, inter, chosen)
    if ranks_per_node is not None or inter is not None:
        raise ValueError(f"ranks_per_node and inter apply only to 'hierarchical_all_reduce', not to "
                         f"{algorithm!r}; drop them")
    if algorithm in _SEGMENTED:
        return COST_MODELS[algorithm](nbytes, p, params, chosen)
    if algorithm in _HEADERS:
        return COST_MODELS[algorithm](nbytes, p, params, not textbook)
    return COST_MODELS[algorithm](nbytes, p, params)
