"""Topologies as graphs, and what an all-reduce should cost on them.

A `Topology` is a graph of GPUs, NVSwitches, PCIe switches, NICs and a network fabric; every `Link` is
full duplex, with a bandwidth per direction (GB/s, from `catalog`) and a latency (seconds, an assumption:
see `Latencies`). A ring step sends one chunk from each GPU to the next one at the same time; when several
hops of a step cross the same link in the same direction they share it, so a hop's bandwidth is the
smallest share along its path. The step lasts as long as its slowest hop -- the ring's *bottleneck* --
and a ring all-reduce of n bytes on p GPUs takes 2(p-1) steps of n/p bytes (Patarasuk & Yuan 2009):

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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from distlab.collectives import cost_model
from distlab.hardware import catalog

ALGORITHMS = ("flat_ring", "two_level_ring", "tree")
SERVERS = ("DGX-1", "DGX A100", "DGX H100")
# DGX-1 hybrid cube-mesh (V100): NVLinks between each pair of GPUs. Each GPU has 6; with one link per
# pair this is the P100 DGX-1 (4 links per GPU). Two quads fully connected plus GPU i <-> GPU i+4.
DGX1_NVLINKS = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
                (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}
DGX1_RING = (0, 3, 2, 1, 5, 6, 7, 4)  # a cycle through all 8 GPUs in which every hop has two NVLinks


@dataclass(frozen=True)
class Latencies:
    """Per-hop latency in seconds of each kind of link. The defaults are illustrative assumptions for the
    model (of the order the literature reports), not figures from a datasheet: set your own."""

    nvlink: float = 1e-6
    pcie: float = 1e-6
    network: float = 5e-6


@dataclass(frozen=True)
class Link:
    """A full-duplex link: `GBps` per direction (1 GB = 1e9 bytes), `latency` in seconds."""

    a: str
    b: str
    GBps: float
    latency: float
    kind: str


@dataclass(frozen=True)
class Hop:
    """One ring hop: its path, bandwidth after sharing (GB/s per direction), latency, and slowest link."""

    src: str
    dst: str
    path: tuple[str, ...]
    GBps: float
    latency: float
    bottleneck: Link


@dataclass
class Topology:
    """An undirected graph of devices (name -> kind) and full-duplex links."""

    name: str
    nodes: dict[str, str] = field(default_factory=dict)
    links: dict[frozenset[str], Link] = field(default_factory=dict)
    _adjacent: dict[str, list[str]] | None = field(default=None, repr=False, compare=False)

    def merge(self, other: Topology) -> None:
        """Add all of `other`'s nodes and links (names must not clash)."""
        self.nodes.update(other.nodes)
        self.links.update(other.links)
        self._adjacent = None

    def add_node(self, name: str, kind: str) -> None:
        self.nodes[name] = kind

    def add_link(self, a: str, b: str, GBps: float, latency: float, kind: str) -> None:
        """Add a link; bandwidth must be > 0 and finite, latency >= 0 and finite, both ends known."""
        for end in (a, b):
            if end not in self.nodes:
                raise ValueError(f"link {a!r}-{b!r}: node {end!r} is not in topology {self.name!r}; "
                                 f"add it first with add_node({end!r}, kind)")
        if a == b:
            raise ValueError(f"link {a!r}-{b!r} joins a node to itself; link two different nodes")
        if not (isinstance(GBps, (int, float)) and math.isfinite(GBps) and GBps > 0):
            raise ValueError(f"link {a!r}-{b!r}: bandwidth GBps={GBps!r} must be a finite number > 0 "
                             "(GB/s per direction), e.g. 25.0")
        if not (isinstance(latency, (int, float)) and math.isfinite(latency) and latency >= 0):
            raise ValueError(f"link {a!r}-{b!r}: latency={latency!r} must be a finite number >= 0 seconds, "
                             "e.g. 1e-6")
        self.links[frozenset((a, b))] = Link(a, b, float(GBps), float(latency), kind)
        self._adjacent = None

    def link(self, a: str, b: str) -> Link:
        return self.links[frozenset((a, b))]

    def neighbours(self, a: str) -> list[str]:
        if self._adjacent is None:
            adjacent: dict[str, list[str]] = {n: [] for n in self.nodes}
            for link in self.links.values():
                adjacent[link.a].append(link.b)
                adjacent[link.b].append(link.a)
            self._adjacent = {n: sorted(v) for n, v in adjacent.items()}
        return self._adjacent[a]

    def gpus(self) -> list[str]:
        return [n for n, kind in self.nodes.items() if kind == "gpu"]

    def path(self, a: str, b: str) -> tuple[str, ...]:
        """The widest of the shortest paths (fewest hops, then largest smallest bandwidth) from a to b."""
        for end in (a, b):
            if end not in self.nodes:
                raise ValueError(f"{end!r} is not a node of topology {self.name!r}; "
                                 f"GPUs are {', '.join(self.gpus())}")
        best: dict[str, tuple[float, tuple[str, ...]]] = {a: (math.inf, (a,))}
        frontier = [a]
        while frontier and b not in best:
            layer: dict[str, tuple[float, tuple[str, ...]]] = {}
            for u in frontier:
                for v in self.neighbours(u):
                    if v in best:
                        continue
                    width = min(best[u][0], self.link(u, v).GBps)
                    if v not in layer or width > layer[v][0]:
                        layer[v] = (width, best[u][1] + (v,))
            best.update(layer)
            frontier = sorted(layer)
        if b not in best:
            raise ValueError(f"topology {self.name!r} is disconnected: no path from {a!r} to {b!r}; "
                             "add a link that joins their parts")
        return best[b][1]

    def check_connected(self) -> None:
        """Raise ValueError naming the unreachable nodes if the graph is not connected."""
        if not self.nodes:
            raise ValueError(f"topology {self.name!r} has no nodes; add GPUs and links")
        start = next(iter(self.nodes))
        seen, todo = {start}, [start]
        while todo:
            for v in self.neighbours(todo.pop()):
                if v not in seen:
                    seen.add(v)
                    todo.append(v)
        missing = sorted(set(self.nodes) - seen)
        if missing:
            raise ValueError(f"topology {self.name!r} is disconnected: {', '.join(missing)} cannot be "
                             f"reached from {start!r}; add links that join them")


# --------------------------------------------------------------------------------------------------
# Servers and clusters, built from the catalog
# --------------------------------------------------------------------------------------------------

def server_topology(server: str, lat: Latencies = Latencies(), prefix: str = "") -> Topology:
    """One server's GPUs, GPU fabric, PCIe switches and NICs ("DGX-1", "DGX A100" or "DGX H100").

    DGX-1: the hybrid cube-mesh of `DGX1_NVLINKS`, each NVLink at the GPU's NVLink rate; two GPUs and one
    NIC per PCIe switch. NVSwitch servers: the switches drawn as one crossbar that every GPU reaches with
    all its NVLinks; GPU i and NIC i behind one PCIe switch (two of each per switch in a DGX A100; the
    same pairing is assumed for DGX H100), drawn as one PCIe link from the GPU to its own NIC.
    """
    if server not in SERVERS:
        raise ValueError(f"server {server!r} cannot be simulated; choose one of {', '.join(SERVERS)} "
                         f"(the catalog knows {', '.join(catalog.names('server'))})")
    spec = catalog.lookup("server", server)
    gpu = catalog.lookup("gpu", spec.gpu)
    nvlink = catalog.lookup("nvlink", gpu.nvlink)
    pcie = catalog.lookup("pcie", gpu.pcie).link_GBps_per_direction(16)
    topo = Topology(f"{prefix}{server}")
    for i in range(spec.gpus):
        topo.add_node(f"{prefix}gpu{i}", "gpu")
    if spec.gpu_fabric == "hybrid cube-mesh":
        for (i, j), count in DGX1_NVLINKS.items():
            topo.add_link(f"{prefix}gpu{i}", f"{prefix}gpu{j}", count * nvlink.link_GBps_per_direction,
                          lat.nvlink, f"NVLink x{count}")
    else:
        topo.add_node(f"{prefix}nvswitch", "switch")
        for i in range(spec.gpus):
            topo.add_link(f"{prefix}gpu{i}", f"{prefix}nvswitch", nvlink.gpu_GBps_per_direction, lat.nvlink,
                          f"NVLink x{nvlink.links_per_gpu}")
    if spec.gpu_fabric == "hybrid cube-mesh":  # two GPUs and one NIC behind each PCIe switch
        for k in range(spec.nics):
            topo.add_node(f"{prefix}pcie{k}", "pcie")
            topo.add_node(f"{prefix}nic{k}", "nic")
            topo.add_link(f"{prefix}nic{k}", f"{prefix}pcie{k}", pcie, lat.pcie, f"{gpu.pcie} x16")
            for i in (2 * k, 2 * k + 1):
                topo.add_link(f"{prefix}gpu{i}", f"{prefix}pcie{k}", pcie, lat.pcie, f"{gpu.pcie} x16")
    else:  # GPU i and NIC i share a PCIe switch: the path between them is drawn as one PCIe x16 link
        for i in range(spec.nics):
            topo.add_node(f"{prefix}nic{i}", "nic")
            topo.add_link(f"{prefix}gpu{i}", f"{prefix}nic{i}", pcie, 2 * lat.pcie,
                          f"{gpu.pcie} x16 via switch")
    return topo


@dataclass
class Cluster:
    """`nodes` servers of one kind on a non-blocking InfiniBand fat tree (drawn as one `fabric` node that
    every NIC reaches at its full rate: a fat tree's full bisection bandwidth, Leiserson 1985)."""

    server: str
    nodes: int
    latencies: Latencies = field(default_factory=Latencies)

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes={self.nodes!r} must be a positive integer number of servers, e.g. 4")
        spec = catalog.lookup("server", self.server) if self.server in SERVERS else None
        self.topology = Topology(f"{self.nodes} x {self.server}")
        for k in range(self.nodes):
            self.topology.merge(server_topology(self.server, self.latencies, prefix=f"n{k}/"))
        assert spec is not None  # server_topology raised for an unknown server
        self.gpus_per_node = spec.gpus
        if self.nodes > 1:
            self.topology.add_node("fabric", "fabric")
            for k in range(self.nodes):
                for n in range(spec.nics):
                    self.topology.add_link(f"n{k}/nic{n}", "fabric", spec.nic_GBps_per_direction,
                                           self.latencies.network, f"InfiniBand {spec.nic_Gbps:g} Gb/s")
        self.topology.check_connected()

    @property
    def intra_order(self) -> tuple[int, ...]:
        """Local GPU indices in the ring order used inside one server."""
        return DGX1_RING if self.server == "DGX-1" else tuple(range(self.gpus_per_node))

    def gpu(self, node: int, local: int) -> str:
        return f"n{node}/gpu{local}"

    def flat_ring(self) -> list[str]:
        """All GPUs in one ring, server after server, each server in `intra_order`."""
        return [self.gpu(k, j) for k in range(self.nodes) for j in self.intra_order]


# --------------------------------------------------------------------------------------------------
# Rings on a topology
# --------------------------------------------------------------------------------------------------

def _check_order(topo: Topology, order: Sequence[str]) -> list[str]:
    order = list(order)
    if not order:
        raise ValueError("ring order is empty; pass the GPUs in ring order, e.g. ['gpu0', 'gpu1']")
    unknown = [g for g in order if topo.nodes.get(g) != "gpu"]
    if unknown:
        raise ValueError(f"ring order has {unknown} which are not GPUs of {topo.name!r}; "
                         f"GPUs are {', '.join(topo.gpus())}")
    if len(set(order)) != len(order):
        raise ValueError(f"ring order {order} visits a GPU twice; list each GPU once")
    return order


def ring_hops(topo: Topology, rings: Sequence[Sequence[str]]) -> list[list[Hop]]:
    """The hops of rings that run at the same time; hops crossing a link in one direction share it."""
    orders = [_check_order(topo, r) for r in rings]
    paths = [[topo.path(o[i], o[(i + 1) % len(o)]) for i in range(len(o))] if len(o) > 1 else []
             for o in orders]
    use = Counter((p[i], p[i + 1]) for ring in paths for p in ring for i in range(len(p) - 1))
    out = []
    for ring in paths:
        hops = []
        for p in ring:
            edges = [(p[i], p[i + 1]) for i in range(len(p) - 1)]
            shares = [(topo.link(u, v).GBps / use[(u, v)], topo.link(u, v)) for u, v in edges]
            bw, slow = min(shares, key=lambda s: s[0])
            hops.append(Hop(p[0], p[-1], p, bw, sum(topo.link(u, v).latency for u, v in edges), slow))
        out.append(hops)
    return out


def bottleneck(topo: Topology, order: Sequence[str]) -> Hop:
    """The ring's slowest hop (lowest bandwidth; ties: highest latency): it sets the pace of every step."""
    hops = ring_hops(topo, [order])[0]
    if not hops:
        raise ValueError("a ring of one GPU has no hops; pass at least two GPUs")
    return min(hops, key=lambda h: (h.GBps, -h.latency))


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
    return np.max([cost_model.ring_all_reduce_time(n, p, m, segment_bytes=None) for m in per_hop], axis=0)


def ring_all_reduce_time(topo: Topology, order: Sequence[str], nbytes: ArrayLike) -> NDArray[np.float64]:
    """2(p-1) steps of n/p bytes, each as slow as the slowest hop (see the module docstring)."""
    n, p = _nbytes(nbytes), len(_check_order(topo, order))
    return _ring(ring_hops(topo, [order])[0], n, p)


def predict_all_reduce(cluster: Cluster, nbytes: ArrayLike, algorithm: str = "two_level_ring"
                       ) -> NDArray[np.float64]:
    """Predicted seconds of an all-reduce of `nbytes` (vectorised) on every GPU of `cluster`."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    n, topo, m, big_n = _nbytes(nbytes), cluster.topology, cluster.gpus_per_node, cluster.nodes
    if algorithm == "flat_ring":
        return ring_all_reduce_time(topo, cluster.flat_ring(), n)
    intra = ring_hops(topo, [[cluster.gpu(k, j) for j in cluster.intra_order] for k in range(big_n)])
    intra_hops = [h for ring in intra for h in ring]
    across = [[cluster.gpu(k, j) for k in range(big_n)] for j in range(m)]
    inter = ring_hops(topo, across) if big_n > 1 else []
    inter_hops = [h for ring in inter for h in ring]
    if algorithm == "two_level_ring":
        # reduce-scatter + all-gather inside the servers = a ring all-reduce of n bytes on m GPUs; across
        # servers, m rings at once, each a ring all-reduce of n/m bytes on N GPUs.
        return _ring(intra_hops, n, m) + _ring(inter_hops, n / m, big_n)
    chain = (m - 1) * max(h.latency for h in intra_hops) + n / (min(h.GBps for h in intra_hops) * 1e9) \
        if m > 1 else 0 * n
    if big_n == 1:
        return 2 * chain
    node_GBps = m * min(h.GBps for h in inter_hops)  # the data is split over all NICs of a node
    depth = math.ceil(math.log2(big_n))
    return 2 * chain + 2 * depth * max(h.latency for h in inter_hops) + 2 * n / (node_GBps * 1e9)
