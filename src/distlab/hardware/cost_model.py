"""What an all-reduce should cost on a topology: ring hops, the bottleneck, and three algorithms.

A `Topology` (built in `topology.py`) is a graph of GPUs, NVSwitches, PCIe switches, NICs and a network
fabric; every `Link` is full duplex, with a bandwidth per direction (GB/s, from `catalog`) and a latency
(seconds, an assumption: see `Latencies`). A ring step sends one chunk from each GPU to the next one at
the same time; when several hops of a step cross the same link in the same direction they share it, so
a hop's bandwidth is the smallest share along its path. The step lasts as long as its slowest hop -- the
ring's *bottleneck* -- and a ring all-reduce of n bytes on p GPUs takes 2(p-1) steps of n/p bytes
(Patarasuk & Yuan 2009):

    T_ring = 2 (p-1) * max over hops (latency + (n/p) / bandwidth)

that is, the largest over the hops of Chapter 1's textbook ring formula, 2(p-1) alpha + 2 (p-1)/p n beta,
with alpha and beta of that hop: the code calls `distlab.collectives.cost_model.ring_all_reduce_time` for
each hop rather than writing the formula a second time.

Three all-reduce algorithms on a cluster of N servers with m GPUs each (`predict_all_reduce`):
- ``flat_ring``: one ring through all N*m GPUs, server after server. Every step waits for the hop that
  crosses the network, so the NVLinks idle most of the time.
- ``two_level_ring``: a ring reduce-scatter inside each server (NVLink), then m rings across servers, one
  per local GPU index and so one per NIC, each all-reducing n/m bytes, then a ring all-gather inside each
  server (the reduce-scatter form of Chapter 1's two-level all-reduce, its exercise 3 -- not the leader
  form of `collectives.hierarchical_all_reduce` -- and what NCCL gets from one ring channel per NIC).
- ``tree``: a chain reduce inside each server, a pipelined double binary tree across servers
  (Sanders, Speck & Traeff 2009; NCCL 2.4) whose latency grows with log2 N instead of N, and a chain
  broadcast. Phases are added, not overlapped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from distlab.collectives import cost_model
from distlab.ring_hops import Hop, bottleneck, check_order, ring_hops
from distlab.topology import Cluster, Topology

__all__ = ["ALGORITHMS", "Hop", "bottleneck", "predict_all_reduce", "ring_all_reduce_time", "ring_hops"]

ALGORITHMS = ("flat_ring", "two_level_ring", "tree")


def _nbytes(n: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(n, dtype=np.float64)
    if np.any(~np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"nbytes={n!r} must be sizes in bytes >= 0, e.g. 64 << 20")
    return arr


def _ring(hops: Sequence[Hop], n: NDArray[np.float64], p: int) -> NDArray[np.float64]:
    """Ring all-reduce of n bytes on p GPUs whose steps wait for the slowest of `hops`: the largest over
    the hops of Chapter 1's textbook formula with that hop's alpha (latency) and beta (1 / bandwidth)."""
    if not hops or p == 1:
        return 0 * n
    per_hop = [cost_model.MachineParams(alpha=h.latency, beta=1 / (h.GBps * 1e9)) for h in hops]
    return np.max([cost_model.ring_all_reduce_time(n, p, m) for m in per_hop], axis=0)


def ring_all_reduce_time(topo: Topology, order: Sequence[str], nbytes: ArrayLike) -> NDArray[np.float64]:
    """2(p-1) steps of n/p bytes, each as slow as the slowest hop (see the module docstring)."""
    n, p = _nbytes(nbytes), len(check_order(topo, order))
    return _ring(ring_hops(topo, [order])[0], n, p)


def predict_all_reduce(cluster: Cluster, nbytes: ArrayLike, algorithm: str = "two_level_ring"
                       ) -> NDArray[np.float64]:
    """Predicted seconds of an all-reduce of `nbytes` (vectorised) on every GPU of `cluster`."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    n, topo, m, big_n = _nbytes(nbytes), cluster.topology, cluster.gpus_per_node, cluster.nodes
    if algorithm == "flat_ring":
        return ring_all_reduce_time(topo, cluster.flat_ring(), n)
    intra_hops, inter_hops = _two_level_hops(cluster)
    if algorithm == "two_level_ring":
        # reduce-scatter + all-gather inside the servers = a ring all-reduce of n bytes on m GPUs; across
        # servers, m rings at once, each a ring all-reduce of n/m bytes on N GPUs.
        return _ring(intra_hops, n, m) + _ring(inter_hops, n / m, big_n)
    return _tree(intra_hops, inter_hops, n, m, big_n)


def _two_level_hops(cluster: Cluster) -> tuple[list, list]:
    """The hops of the rings inside every server, and of the m rings across servers (one per local GPU)."""
    topo, m, big_n = cluster.topology, cluster.gpus_per_node, cluster.nodes
    intra = ring_hops(topo, [[cluster.gpu(k, j) for j in cluster.intra_order] for k in range(big_n)])
    across = [[cluster.gpu(k, j) for k in range(big_n)] for j in range(m)]
    inter = ring_hops(topo, across) if big_n > 1 else []
    return [h for ring in intra for h in ring], [h for ring in inter for h in ring]


def _tree(intra_hops: list, inter_hops: list, n: NDArray[np.float64], m: int, big_n: int
          ) -> NDArray[np.float64]:
    """A chain inside each server, then a tree of depth ceil(log2 N) across servers, reduce and broadcast."""
    chain = (m - 1) * max(h.latency for h in intra_hops) + n / (min(h.GBps for h in intra_hops) * 1e9) \
        if m > 1 else 0 * n
    if big_n == 1:
        return 2 * chain
    node_GBps = m * min(h.GBps for h in inter_hops)  # the data is split over all NICs of a node
    depth = math.ceil(math.log2(big_n))
    return 2 * chain + 2 * depth * max(h.latency for h in inter_hops) + 2 * n / (node_GBps * 1e9)
