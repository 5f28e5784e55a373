"""The hops of rings on a topology: for each hop its path, its bandwidth after sharing and its latency,
and a ring's bottleneck.

A ring step sends one chunk from each GPU to the next one at the same time; when several hops of rings that
run at once cross the same link in the same direction they share it, so a hop's bandwidth is the smallest
share along its path (`ring_hops`), and the slowest hop sets the pace of every step (`bottleneck`;
Patarasuk & Yuan 2009). Chapter 8 prices an all-reduce with it (`distlab.hardware.cost_model`); chapter
6's dispatch time and chapter 9's placement read the hops too, so it sits on the ground floor beside the
graphs (`distlab.topology`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from distlab.topology import Link, Topology


@dataclass(frozen=True)
class Hop:
    """One ring hop: its path, bandwidth after sharing (GB/s per direction), latency, and slowest link."""

    src: str
    dst: str
    path: tuple[str, ...]
    GBps: float
    latency: float
    bottleneck: Link


def check_order(topo: Topology, order: Sequence[str]) -> list[str]:
    """`order` as a list, or a ValueError naming what is wrong with it as a ring of `topo`'s GPUs."""
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
    orders = [check_order(topo, r) for r in rings]
    paths = [_ring_paths(topo, o) for o in orders]
    use = Counter((p[i], p[i + 1]) for ring in paths for p in ring for i in range(len(p) - 1))
    return [[_hop(topo, p, use) for p in ring] for ring in paths]


def _ring_paths(topo: Topology, order: list[str]) -> list[tuple[str, ...]]:
    """The path of each hop of the ring `order`, from each GPU to the next (none for a ring of one GPU)."""
    if len(order) < 2:
        return []
    return [topo.path(order[i], order[(i + 1) % len(order)]) for i in range(len(order))]


def _hop(topo: Topology, path: tuple[str, ...], use: Counter) -> Hop:
    """The hop along `path`: its share of each link (`use` hops cross it that way), slowest link, latency."""
    edges = [(path[i], path[i + 1]) for i in range(len(path) - 1)]
    shares = [(topo.link(u, v).GBps / use[(u, v)], topo.link(u, v)) for u, v in edges]
    bw, slow = min(shares, key=lambda s: s[0])
    return Hop(path[0], path[-1], path, bw, sum(topo.link(u, v).latency for u, v in edges), slow)


def bottleneck(topo: Topology, order: Sequence[str]) -> Hop:
    """The ring's slowest hop (lowest bandwidth; ties: highest latency): it sets the pace of every step."""
    hops = ring_hops(topo, [order])[0]
    if not hops:
        raise ValueError("a ring of one GPU has no hops; pass at least two GPUs")
    return min(hops, key=lambda h: (h.GBps, -h.latency))
