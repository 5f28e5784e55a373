"""Chapter 8's pictures, drawn from `catalog` and `cost_model`, and the ipywidgets explorer.

Every function returns a matplotlib Figure, closed in pyplot (a notebook shows it once, ``savefig`` still
works). Nothing is measured here: the bandwidth chart plots catalog rows, the all-reduce charts plot the
simulator's predictions, whose latencies are the illustrative `topology.Latencies` defaults (the titles
say so). Colours: the Okabe & Ito (2008) palette.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from distlab import catalog, topology
from distlab.explorers import live_explorer, message_figure
from distlab.hardware import cost_model
from distlab.style import OKABE_ITO, done

ALGO_STYLE = {"flat_ring": (OKABE_ITO[5], "flat ring"), "two_level_ring": (OKABE_ITO[4], "two-level ring"),
              "tree": (OKABE_ITO[2], "tree (double binary, across servers)")}
CUBE_XY = {0: (0, 2), 1: (2, 2), 2: (0, 0), 3: (2, 0),  # front face of the cube, then the back face
           4: (1.6, 3.2), 5: (3.6, 3.2), 6: (1.6, 1.2), 7: (3.6, 1.2)}
SIZES = 2.0 ** np.arange(10, 31)  # 1 KiB .. 1 GiB


def cube_mesh_figure(orders: Sequence[Sequence[int]] = ((0, 1, 2, 3, 4, 5, 6, 7), topology.DGX1_RING),
                     gpu: str = "V100") -> Figure:
    """The DGX-1 hybrid cube-mesh, one panel per ring: NVLinks (thick = two), the ring's hops as arrows,
    its slowest hops (the bottleneck) in red, the others in blue."""
    topo = topology.server_topology("DGX-1")
    per_link = catalog.lookup("nvlink", catalog.lookup("gpu", gpu).nvlink).link_GBps_per_direction
    fig, axes = plt.subplots(1, len(orders), figsize=(5.5 * len(orders), 5), squeeze=False)
    for ax, order in zip(axes[0], orders, strict=True):
        hops = cost_model.ring_hops(topo, [[f"gpu{i}" for i in order]])[0]
        slow = min(h.GBps for h in hops)
        for (i, j), count in topology.DGX1_NVLINKS.items():
            (x0, y0), (x1, y1) = CUBE_XY[i], CUBE_XY[j]
            ax.plot([x0, x1], [y0, y1], color="0.8", lw=2.5 * count, zorder=1, solid_capstyle="round")
        for h in hops:
            for u, v in zip(h.path, h.path[1:], strict=False):
                (x0, y0), (x1, y1) = CUBE_XY[int(u[3:])], CUBE_XY[int(v[3:])]
                colour = OKABE_ITO[5] if h.GBps == slow else OKABE_ITO[4]
                ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=3,
                            arrowprops={"arrowstyle": "-|>", "color": colour, "lw": 1.6, "shrinkA": 14,
                                        "shrinkB": 14, "connectionstyle": "arc3,rad=0.12"})
        for i, (x, y) in CUBE_XY.items():
            ax.scatter([x], [y], s=700, color="white", edgecolor="black", zorder=4)
            ax.text(x, y, f"GPU{i}", ha="center", va="center", fontsize=8, zorder=5)
        ax.set_title(f"ring {' → '.join(map(str, order))} → {order[0]}\nslowest hop (red): {slow:g} GB/s "
                     "per direction", fontsize=9)
        ax.set_xlim(-0.4, 4.0)
        ax.set_ylim(-0.4, 3.6)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle(f"DGX-1 hybrid cube-mesh ({gpu}): thin line = 1 NVLink ({per_link:g} GB/s per direction), "
                 "thick line = 2", fontsize=10)
    fig.subplots_adjust(top=0.82)
    return done(fig)


def all_reduce_vs_size_figure(server: str = "DGX A100", nodes: int = 4, sizes: Sequence[float] = SIZES,
                              mark: float | None = None) -> Figure:
    """Predicted all-reduce time against message size for the three algorithms on `nodes` x `server`."""
    cluster = topology.Cluster(server, nodes)
    sizes = np.asarray(sizes, dtype=float)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for algo, (colour, label) in ALGO_STYLE.items():
        ax.loglog(sizes, cost_model.predict_all_reduce(cluster, sizes, algo) * 1e3, color=colour, label=label)
    if mark is not None:
        ax.axvline(mark, color="0.5", ls=":", lw=1)
    ax.set_xlabel("message size n (bytes)")
    ax.set_ylabel("predicted all-reduce time (ms)")
    ax.set_title(f"{nodes} x {server}, {nodes * cluster.gpus_per_node} GPUs: model, not a measurement\n"
                 "(catalog bandwidths; latencies are illustrative assumptions)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return done(fig)


def all_reduce_vs_nodes_figure(server: str = "DGX A100", nbytes: float = 2**28,
                               nodes: Sequence[int] = (1, 2, 4, 8, 16, 32)) -> Figure:
    """Predicted all-reduce time of `nbytes` against the number of servers, for the three algorithms."""
    times = {a: [float(cost_model.predict_all_reduce(topology.Cluster(server, k), nbytes, a)) for k in nodes]
             for a in ALGO_STYLE}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for algo, (colour, label) in ALGO_STYLE.items():
        ax.plot(nodes, np.array(times[algo]) * 1e3, "o-", color=colour, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(nodes), [str(k) for k in nodes])
    ax.set_xlabel(f"servers ({server}, {catalog.lookup('server', server).gpus} GPUs each)")
    ax.set_ylabel("predicted all-reduce time (ms)")
    ax.set_title(f"all-reduce of {nbytes / 2**20:g} MiB: model, not a measurement", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return done(fig)


def bandwidth_generations_figure() -> Figure:
    """Per-direction GB/s of every catalog row: PCIe x16, NVLink per GPU, InfiniBand 4x port."""
    rows = [(g.name + " x16", g.link_GBps_per_direction(16), OKABE_ITO[0]) for g in catalog.TABLES["pcie"]]
    rows += [(f"{g.name} ({g.gpu}), per GPU", g.gpu_GBps_per_direction, OKABE_ITO[4])
             for g in catalog.TABLES["nvlink"]]
    rows += [(f"InfiniBand {g.name} 4x", g.x4_data_GBps_per_direction, OKABE_ITO[2])
             for g in catalog.TABLES["infiniband"]]
    fig, ax = plt.subplots(figsize=(7, 6))
    y = np.arange(len(rows))
    ax.barh(y, [r[1] for r in rows], color=[r[2] for r in rows])
    ax.set_yticks(y, [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("GB/s, one direction (log scale)")
    ax.set_title("Interconnect bandwidth by generation, per direction (distlab.catalog)", fontsize=9)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    return done(fig)


def explorer_frame(server: str = "DGX A100", nodes: int = 4, log2n: int = 26) -> list[Figure]:
    """What the hardware explorer shows: predicted all-reduce time against size on `nodes` x `server` with
    2**log2n bytes marked, then each algorithm's predicted time there and the flat ring's slowest hop."""
    cluster = topology.Cluster(server, nodes)
    n = 2.0 ** log2n
    lines = [f"{label:<38} {float(cost_model.predict_all_reduce(cluster, n, algo)) * 1e3:10.3f} ms"
             for algo, (_, label) in ALGO_STYLE.items()]
    hop = cost_model.bottleneck(cluster.topology, cluster.flat_ring())
    lines.append(f"flat ring's slowest hop: {hop.src} -> {hop.dst}, {hop.GBps:g} GB/s per direction "
                 f"({hop.bottleneck.kind})")
    return [all_reduce_vs_size_figure(server, nodes, mark=n),
            message_figure(f"all-reduce of 2^{log2n} bytes:\n" + "\n".join(lines), monospace=True)]


def explorer() -> Any:
    """ipywidgets explorer: server, number of servers and message size -> predicted times and bottleneck
    (`explorer_frame`, also the static book version over a small grid)."""
    import ipywidgets as widgets

    controls = {
        "server": widgets.Dropdown(options=list(topology.SERVERS), value="DGX A100", description="server"),
        "nodes": widgets.IntSlider(value=4, min=1, max=16, description="servers"),
        "log2n": widgets.IntSlider(value=26, min=10, max=30, description="log2 bytes")}
    return live_explorer("hardware", explorer_frame, controls,
                         {"server": list(topology.SERVERS), "nodes": [1, 4, 16]})
