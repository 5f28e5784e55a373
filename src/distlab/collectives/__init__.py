"""Chapter 1: collective communication, built from point-to-point messages.

Every collective runs inside a rank on the ranks of one process group, `group=` (None = the whole world;
e.g. `mesh["tp"].get_group()` of `distlab.mesh.grid`), with ranks, roots and chunk owners numbered
inside that group. One idea per file:
- `p2p`: the point-to-point layer every algorithm is written with (the `Team` of ranks an algorithm runs
  on, reducers, segmented exchange, send_all, recv_all, exchange_reduce); `segmenting`: `Segmenting`,
  how messages are cut into segments (`segmenting=`, default `DEFAULT`).
- `ring`: the textbook ring all-reduce and its schedule (Patarasuk & Yuan 2009); `segmented_ring`: the
  tuned ring, whose chunks stream in segments: reduce-scatter, all-gather and all-reduce; `workspace`:
  `Workspace`, the receive buffers a caller keeps across calls of the tuned ring (`workspace=`).
- `trees`: the binomial-tree broadcast, reduce, scatter and gather; `all_reduce`: recursive doubling and
  the two-level all-reduce; `all_to_all`: the pairwise all-to-all (Thakur, Rabenseifner & Gropp 2005).
- `algorithms`: the ALGORITHMS registry the benchmark reads.
- `cost_model`: the alpha-beta-gamma model of each algorithm and `predict` (standard library and numpy
  only); `fit`: measuring alpha, beta and gamma on this machine (`fit_machine`).
- `busbw`: sizes, algbw and busbw as nccl-tests defines them, and the tables; `measure`: the timing loop
  inside every rank; `bench`: `benchmark`, which starts the ranks; `__main__`: the command line
  `python -m distlab.collectives`.
- `traces`: what each collective does, computed on symbolic data; `figures/`: the pictures drawn from
  it (`semantics`, `schedules`, `cost`).
- `exercises`: the checks of the lab's exercises; `all_reduce_diagnosis`: how they read a wrong
  all-reduce inside a rank.
"""

from distlab.collectives.algorithms import ALGORITHMS, Algorithm
from distlab.collectives.all_reduce import hierarchical_all_reduce, recursive_doubling_all_reduce
from distlab.collectives.all_to_all import pairwise_all_to_all
from distlab.collectives.fit import fit_machine
from distlab.collectives.ring import RingStep, chunk_bounds, ring_all_reduce, ring_all_reduce_schedule
from distlab.collectives.segmented_ring import ring_all_gather, ring_reduce_scatter, segmented_ring_all_reduce
from distlab.collectives.segmenting import Segmenting
from distlab.collectives.trees import gather, scatter, tree_broadcast, tree_reduce
from distlab.collectives.workspace import Workspace

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "RingStep",
    "Segmenting",
    "Workspace",
    "chunk_bounds",
    "fit_machine",
    "gather",
    "hierarchical_all_reduce",
    "pairwise_all_to_all",
    "recursive_doubling_all_reduce",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_all_reduce_schedule",
    "ring_reduce_scatter",
    "scatter",
    "segmented_ring_all_reduce",
    "tree_broadcast",
    "tree_reduce",
]
