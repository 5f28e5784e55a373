"""Where the mesh's axes land on real machines, and what a step's communication then costs.

A `DeviceMesh` numbers ranks; a job puts rank r on some GPU of some server. Which axes share a server
decides which traffic rides NVLink and which crosses the network. Narayanan et al. 2021 (sec. 3.2-3.3)
keep tensor parallelism inside a server (its all-reduces are on the critical path of every layer, and
a server's NVLink gives several times a NIC's bandwidth) and let pipeline or data parallelism cross.

`assign(plan, cluster, order)`: `order` lists the axes outermost first; a rank's slot is the row-major
number of its (dp, pp, tp) coordinates taken in that order, and slot k is local GPU k % g of server
k // g (g GPUs per server). ("dp", "pp", "tp") keeps each tp group on one server; ("tp", "pp", "dp")
spreads every tp group over servers: the wrong placement.

`predict_placement` prices one step with chapter 8's topology (`distlab.topology.Cluster`,
links with bandwidth per direction from `distlab.catalog`) and its ring model
(`distlab.ring_hops.ring_hops`): all groups of an axis run their rings at once, so hops that cross
the same link share it. Each axis's calls then take, from `cost_model.predicted_traffic`,

    t_axis = (ring steps) x alpha + (bytes sent) / bandwidth,

with alpha and bandwidth of the axis's slowest hop (chapter 1's alpha-beta model, which is what
`simulate` applies per hop). For pp the "rings" are the pairs of consecutive stages. The model adds the
axes' times: no overlap of communication with compute or with each other, so it ranks placements and
does not predict a step's wall-clock time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from distlab.mesh import layout
from distlab.models import GPTConfig
from distlab.parallel3d.config import Plan3D
from distlab.parallel3d.cost_model import AXES, predicted_traffic
from distlab.ring_hops import ring_hops
from distlab.topology import Cluster

# The example the book and the lab price: a GPT of about 1.3 B parameters in bf16 on two DGX A100 servers:
# GPT-3 XL's 24 layers of width 2048 (Brown et al. 2020, table 2.1; we use 16 heads of 128, since the
# table's 24 heads of 128 do not multiply to 2048, and heads do not change the bytes), and GPT-2's
# vocabulary padded to a multiple of 64 (50304).
EXAMPLE_CONFIG = GPTConfig(vocab_size=50304, block_size=2048, n_layer=24, n_head=16, n_embd=2048)
EXAMPLE_PLAN = Plan3D(dp=2, pp=2, tp=4, m=8, schedule="1f1b", zero_stage=1)
EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_DTYPE_BYTES = 32, 2048, 2
ORDERS = {"TP inside a server, DP across": ("dp", "pp", "tp"),
          "TP inside, PP across (the mesh's default)": ("pp", "dp", "tp"),
          "TP across servers (wrong)": ("tp", "pp", "dp")}


def group_crosses_servers(size: int, stride: int, gpus_per_node: int) -> bool:
    """Whether some group of an axis crosses servers when its `size` ranks sit `stride` apart (the product of
    the axes inside it) and ranks fill servers of `gpus_per_node` in order: every group stays inside one
    server exactly when size x stride <= gpus_per_node and divides it. So tp = 6 on servers of 8 puts ranks
    6-11 on two servers, and that group's ring runs at the network's speed (chapter 8); all groups of an axis
    run their collectives together, so the slowest sets the pace. `assign` with the axes' order gives the
    same answer GPU by GPU (tests/test_plan_model.py checks it)."""
    if size <= 1:
        return False
    span = size * stride
    return span > gpus_per_node or gpus_per_node % span != 0


def assign(plan: Plan3D, cluster: Cluster, order: tuple[str, ...]) -> dict[int, str]:
    """Global rank -> GPU name of `cluster`, placing the axes in `order` (outermost first)."""
    if sorted(order) != sorted(AXES):
        raise ValueError(f"order={order!r} must list each of {AXES} once, outermost first, e.g. "
                         "('dp', 'pp', 'tp') to keep tp inside a server")
    gpus = cluster.nodes * cluster.gpus_per_node
    if plan.world_size != gpus:
        raise ValueError(f"the plan needs dp x pp x tp = {plan.world_size} GPUs but the cluster has {gpus} "
                         f"({cluster.nodes} x {cluster.gpus_per_node}); choose sizes whose product is {gpus}")
    grid_of = plan.layout
    out = {}
    for rank in range(grid_of.world_size):
        c = grid_of.coords(rank)
        slot = 0
        for d in order:
            slot = slot * grid_of.size(d) + c[d]
        out[rank] = cluster.gpu(slot // cluster.gpus_per_node, slot % cluster.gpus_per_node)
    return out


@dataclass(frozen=True)
class AxisCost:
    """One mesh axis under one placement: its slowest hop's bandwidth (GB/s per direction, after sharing) and
    latency, whether its groups cross servers, and the predicted seconds per step of its calls."""

    axis: str
    GBps: float
    latency: float
    crosses_servers: bool
    seconds: float


@dataclass(frozen=True)
class PlacementCost:
    """One placement: its name, its axis order (outermost first) and each axis's `AxisCost`."""

    name: str
    order: tuple[str, ...]
    axes: dict[str, AxisCost]

    @property
    def seconds(self) -> float:
        return sum(a.seconds for a in self.axes.values())


def _rings(plan: Plan3D, axis: str, gpu: dict[int, str]) -> list[list[str]]:
    groups = layout(dp=plan.dp, pp=plan.pp, tp=plan.tp)[axis]
    if axis == "pp":
        return [[gpu[g[i]], gpu[g[i + 1]]] for g in groups for i in range(len(g) - 1)]
    return [[gpu[r] for r in g] for g in groups if len(g) > 1]


def predict_placement(name: str, order: tuple[str, ...], cluster: Cluster, config: GPTConfig = EXAMPLE_CONFIG,
                      plan: Plan3D = EXAMPLE_PLAN, batch: int = EXAMPLE_BATCH, seq: int = EXAMPLE_SEQ,
                      dtype_bytes: int = EXAMPLE_DTYPE_BYTES) -> PlacementCost:
    """The predicted communication seconds per step of each axis under one placement (module docstring)."""
    gpu = assign(plan, cluster, order)
    traffic = [predicted_traffic(config, plan, batch, seq, s, dtype_bytes) for s in range(plan.pp)]
    axes = {}
    for axis in AXES:
        rings = _rings(plan, axis, gpu)
        hops = [h for ring in ring_hops(cluster.topology, rings) for h in ring] if rings else []
        if not hops:
            axes[axis] = AxisCost(axis, math.inf, 0.0, False, 0.0)
            continue
        slow = min(hops, key=lambda h: (h.GBps, -h.latency))
        crosses = any(ring[0].split("/")[0] != g.split("/")[0] for ring in rings for g in ring)
        seconds = max(sum(t.steps * slow.latency + t.sent_bytes / (slow.GBps * 1e9)
                          for t in tr.values() if t.axis == axis) for tr in traffic)
        axes[axis] = AxisCost(axis, slow.GBps, slow.latency, crosses, seconds)
    return PlacementCost(name, tuple(order), axes)


def compare_placements(cluster: Cluster | None = None, **kwargs: Any) -> list[PlacementCost]:
    """Every placement of `ORDERS` on `cluster` (default: two DGX A100), priced by `predict_placement`."""
    cluster = cluster or Cluster("DGX A100", 2)
    return [predict_placement(name, order, cluster, **kwargs) for name, order in ORDERS.items()]


def placement_table(costs: list[PlacementCost]) -> str:
    """A text table: per placement and axis, the bottleneck bandwidth and the predicted milliseconds."""
    cols = "".join(f"{d + ' GB/s':>9s}{d + ' ms':>9s}" for d in AXES)
    head = f"{'placement':44s}{cols}{'total ms':>10s}"
    lines = [head]
    for c in costs:
        cells = "".join(f"{c.axes[d].GBps:9.0f}{1e3 * c.axes[d].seconds:9.1f}"
                        if math.isfinite(c.axes[d].GBps) else f"{'-':>9s}{0:9.1f}" for d in AXES)
        lines.append(f"{c.name:44s}{cells}{1e3 * c.seconds:10.1f}")
    return "\n".join(lines)
