"""Topologies as graphs: GPUs, NVSwitches, PCIe switches, NICs and a network fabric, built from the catalog.

A `Topology` is an undirected graph whose every `Link` is full duplex, with a bandwidth per direction
(GB/s, from `catalog`) and a latency (seconds, an assumption: see `Latencies`); `Topology.path` finds the
route between two devices. `server_topology` draws one DGX-1 (hybrid cube-mesh, `DGX1_NVLINKS`), DGX A100
or DGX H100 (NVSwitch), and a `Cluster` joins N of them through a non-blocking fat tree. What an
all-reduce costs on such a graph is chapter 8's `distlab.hardware.cost_model`; the hops of rings on it are
`distlab.ring_hops`. Chapter 8 explains these graphs (lab 08 and the book import them as
`distlab.hardware.topology`); they sit on the ground floor because chapters 6, 9 and 11 price traffic on
them too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from distlab import catalog

SERVERS = ("DGX-1", "DGX A100", "DGX H100")
# DGX-1 hybrid cube-mesh (V100): NVLinks between each pair of GPUs, in CUDA / nvidia-smi numbering. Each
# GPU has 6; with one link per pair this is the P100 DGX-1 (4 links per GPU). Two quads fully connected plus
# GPU i <-> GPU i+4.
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
