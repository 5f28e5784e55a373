"""Chapter 1: collective communication, built from point-to-point messages.

`ring` holds the ring algorithms (Patarasuk & Yuan 2009) and the helpers they share; `algorithms` holds
the binomial trees, recursive doubling, the two-level all-reduce and the pairwise all-to-all (Thakur,
Rabenseifner & Gropp 2005), and the ALGORITHMS registry the benchmark reads.
"""

from distlab.collectives.algorithms import (
    ALGORITHMS,
    Algorithm,
    gather,
    hierarchical_all_reduce,
    pairwise_all_to_all,
    recursive_doubling_all_reduce,
    scatter,
    tree_broadcast,
    tree_reduce,
)
from distlab.collectives.ring import (
    RingStep,
    chunk_bounds,
    ring_all_gather,
    ring_all_reduce,
    ring_all_reduce_schedule,
    ring_reduce_scatter,
)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "RingStep",
    "chunk_bounds",
    "gather",
    "hierarchical_all_reduce",
    "pairwise_all_to_all",
    "recursive_doubling_all_reduce",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_all_reduce_schedule",
    "ring_reduce_scatter",
    "scatter",
    "tree_broadcast",
    "tree_reduce",
]
