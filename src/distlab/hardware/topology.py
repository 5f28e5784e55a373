"""Chapter 8's topologies under the name lab 08, lab 09 and the book use: the graphs themselves (servers,
clusters, their links and latencies) are on the ground floor, in `distlab.topology`, because chapters 6, 9
and 11 price their traffic on them too and a chapter imports no later chapter."""

from distlab.topology import (
    DGX1_NVLINKS,
    DGX1_RING,
    SERVERS,
    Cluster,
    Latencies,
    Link,
    Topology,
    server_topology,
)

__all__ = ["DGX1_NVLINKS", "DGX1_RING", "SERVERS", "Cluster", "Latencies", "Link", "Topology",
           "server_topology"]
