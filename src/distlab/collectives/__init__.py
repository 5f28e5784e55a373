"""Chapter 1: collective communication, built from point-to-point messages.

One idea per file:
- `p2p`: the point-to-point layer every algorithm is written with (checking `ranks`, reducers,
  segmented exchange, send_all, recv_all, exchange_reduce) and the segment sizes.
- `ring`: the ring reduce-scatter, all-gather and all-reduce and their schedule (Patarasuk & Yuan 2009).
- `trees`: the binomial-tree broadcast, reduce, scatter and gather; `all_reduce`: recursive doubling and
  the two-level all-reduce; `all_to_all`: the pairwise all-to-all (Thakur, Rabenseifner & Gropp 2005).
- `algorithms`: the ALGORITHMS registry the benchmark reads (and every algorithm, re-exported).
- `cost_model`: the alpha-beta-gamma model of each algorithm and `predict`; `fit`: measuring alpha,
  beta and gamma on this machine (`fit_machine`, also reachable as `cost_model.fit_machine`).
- `busbw`: sizes, algbw and busbw as nccl-tests defines them, and the tables; `measure`: the timing loop
  inside every rank; `bench`: `benchmark` and the command line `python -m distlab.collectives.bench`.
- `traces`: what each collective does, computed on symbolic data; the pictures drawn from it:
  `semantics_figures`, `schedule_figures`, `cost_figures`, all re-exported by `figures`.
- `exercises`: the checks of the lab's exercises; `all_reduce_diagnosis`: how they read a wrong
  all-reduce inside a rank; `check_result`: the report every chapter's checks return.
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
