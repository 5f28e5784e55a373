"""Chapter 1: collective communication, built from point-to-point messages.

One idea per file:
- `p2p`: the point-to-point layer every algorithm is written with (checking `ranks`, reducers,
  segmented exchange, send_all, recv_all, exchange_reduce) and the segment sizes.
- `ring`: the ring reduce-scatter, all-gather and all-reduce and their schedule (Patarasuk & Yuan 2009).
- `algorithms`: the binomial trees, recursive doubling, the two-level all-reduce and the pairwise
  all-to-all (Thakur, Rabenseifner & Gropp 2005), and the ALGORITHMS registry the benchmark reads.
- `cost_model`: the alpha-beta-gamma model of each algorithm and `predict`; `fit`: measuring alpha,
  beta and gamma on this machine (`fit_machine`, also reachable as `cost_model.fit_machine`).
- `busbw`: sizes, algbw and busbw as nccl-tests defines them, and the tables; `bench`: the benchmark
  itself (timing loop, `benchmark`, and the command line `python -m distlab.collectives.bench`).
- `traces`: what each collective does, computed on symbolic data; `figures`: the pictures drawn from it.
- `exercises`: the checks of the lab's exercises.
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
