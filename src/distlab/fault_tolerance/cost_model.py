"""HSDP's cost in closed form: bytes inside a replica group and across, memory, and time on a cluster.

Symbols: Psi parameters in b bytes each, dp = R x S ranks, R replica groups of S ranks (S = 1: plain data
parallelism; R = 1: ZeRO-3 over all dp ranks, Rajbhandari et al. 2020). Per step, every rank of a group
of S gathers each block before its forward and again before its backward and reduce-scatters its
gradient (chapter 7): three collectives about the whole model, B = Psi b, each sending (S-1)/S B per
rank on a ring (`comm_log.ring_bytes`). Across the groups, each rank all-reduces its 1/S slice of the
gradient with the R ranks at its shard position: 2 (R-1)/R (Psi b / S). So per rank

    inside a group:  3 (S-1)/S Psi b          across groups:  2 (R-1)/R Psi b / S

against ZeRO-3 over all R S ranks: 3 (RS-1)/(RS) Psi b, every byte of it on a ring that crosses servers
once there are several. Model states (Psi k bytes, k = 16 for mixed-precision Adam, Rajbhandari et al.
2020 sec. 3.1) cost Psi k / S per rank under HSDP and Psi k / (R S) under ZeRO-3: HSDP buys its lower
traffic with memory.

Time on a chapter-8 cluster (`distlab.hardware`: N servers of m GPUs on a fat tree): a reduce-scatter or
an all-gather is half of a ring all-reduce, so each of ZeRO-3's three collectives over the N m GPUs takes
half of `predict_all_reduce(cluster, Psi b, algorithm)`. HSDP with its shard group on one server (S = m,
R = N) takes half of one server's all-reduce per collective, plus a ring all-reduce of Psi b / m bytes
through one GPU of every server (one NIC per GPU on a DGX H100; the m rings run at once, one per NIC,
so none shares a NIC there).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from distlab.comm_log import ring_bytes
from distlab.hardware.cost_model import predict_all_reduce, ring_all_reduce_time
from distlab.memory.zero.buckets import shard_shape
from distlab.topology import Cluster


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer (a number of ranks)")
    return value


def unit_bytes(shapes: Sequence[Sequence[int]], shard: int, bytes_per_element: int = 4) -> int:
    """B of one collective about one `fully_shard` unit whose parameters have `shapes`, on `shard`
    ranks: each parameter padded to shard x ceil(rows / shard) rows, as chapter 7's `Bucket` lays it out."""
    s = _positive_int("shard", shard)
    per_rank = sum(int(np.prod(shard_shape(tuple(shape), s))) for shape in shapes)
    return s * per_rank * bytes_per_element


def hsdp_bytes(units: Sequence[Sequence[Sequence[int]]], replicate: int, shard: int,
               bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes per rank per step of HSDP(R=`replicate`, S=`shard`) on a model whose `fully_shard` units
    have the parameter shapes `units`: B of the collectives and what a rank sends (ring algorithms),
    inside a replica group ("shard") and across ("replicate"). The replicate all-reduce also carries one
    "had a gradient" flag per parameter (`hsdp.replica_all_reduce_`)."""
    r, s = _positive_int("replicate", replicate), _positive_int("shard", shard)
    gathered = sum(unit_bytes(u, s, bytes_per_element) for u in units)
    n_params = sum(len(u) for u in units)
    slice_bytes = gathered // s + n_params * bytes_per_element
    inside = {"all_gather": 2 * gathered, "reduce_scatter": gathered}  # also called on 1 rank (sends 0)
    across = slice_bytes if r > 1 else 0
    return {"shard_B": inside["all_gather"] + inside["reduce_scatter"], "replicate_B": across,
            "shard_sent": sum(ring_bytes(op, b, s) for op, b in inside.items()),
            "replicate_sent": ring_bytes("all_reduce", across, r)}


def per_rank_bytes(psi: float, replicate: int, shard: int, b: float = 2.0) -> dict[str, float]:
    """The closed form without padding: bytes a rank sends per step inside its group and across."""
    r, s = _positive_int("replicate", replicate), _positive_int("shard", shard)
    return {"inside": 3 * ring_bytes("all_gather", psi * b, s),
            "across": ring_bytes("all_reduce", psi * b / s, r)}


def model_state_bytes(psi: float, replicate: int, shard: int, k: float = 16.0) -> float:
    """Model-state bytes per rank: Psi k / S (the replicas each hold a whole sharded copy)."""
    _positive_int("replicate", replicate)
    return psi * k / _positive_int("shard", shard)


@lru_cache(maxsize=32)
def _cluster(server: str, nodes: int) -> Cluster:
    """One cluster per (server, nodes): building a topology and its paths is the slow part."""
    return Cluster(server, _positive_int("nodes", nodes))


def zero3_time(server: str, nodes: int, psi: float, b: float = 2.0,
               algorithm: str = "two_level_ring") -> float:
    """Seconds of ZeRO-3's communication per step over every GPU of `nodes` servers: three collectives,
    each half of a ring all-reduce of Psi b bytes on the chapter-8 `algorithm` (Patarasuk & Yuan 2009)."""
    return float(1.5 * predict_all_reduce(_cluster(server, nodes), psi * b, algorithm))


def hsdp_time(server: str, nodes: int, psi: float, b: float = 2.0) -> dict[str, float]:
    """Seconds of HSDP's communication per step with one replica group per server (S = m, R = nodes):
    three collectives inside a server, and one all-reduce of the 1/m slice across the servers."""
    n = _positive_int("nodes", nodes)
    one = _cluster(server, 1)
    inside = 1.5 * float(predict_all_reduce(one, psi * b, "two_level_ring"))
    across = 0.0
    if n > 1:
        cluster = _cluster(server, n)
        across = float(ring_all_reduce_time(cluster.topology, [cluster.gpu(k, 0) for k in range(n)],
                                            psi * b / cluster.gpus_per_node))
    return {"inside": inside, "across": across, "total": inside + across}


def compare_on_cluster(server: str, nodes_list: Sequence[int], psi: float, b: float = 2.0,
                       k: float = 16.0) -> list[dict[str, float]]:
    """For each number of servers: ZeRO-3's and HSDP's communication seconds per step and model-state
    GB per GPU (the lab's table and figure)."""
    rows = []
    for n in nodes_list:
        m = _cluster(server, 1).gpus_per_node
        h = hsdp_time(server, n, psi, b)
        rows.append({"nodes": n, "gpus": n * m, "zero3_s": zero3_time(server, n, psi, b),
                     "zero3_flat_s": zero3_time(server, n, psi, b, "flat_ring"),
                     "hsdp_s": h["total"], "hsdp_across_s": h["across"],
                     "zero3_GB": model_state_bytes(psi, 1, n * m, k) / 1e9,
                     "hsdp_GB": model_state_bytes(psi, n, m, k) / 1e9})
    return rows
