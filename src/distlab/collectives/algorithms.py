"""The ALGORITHMS registry: every collective algorithm of this chapter, by name, for the benchmark.

The algorithms live in one file per family, all built from point-to-point messages (`p2p.py`):
`ring.py` (the textbook ring all-reduce), `segmented_ring.py` (the tuned ring: reduce-scatter,
all-gather, all-reduce), `trees.py` (binomial broadcast, reduce, scatter, gather), `all_reduce.py`
(recursive doubling and the two-level all-reduce) and `all_to_all.py` (pairwise exchange). Import them
from there or from `distlab.collectives`. Each runs inside a rank on the ranks of `group` (None = the
whole world), with ranks numbered inside the group.

Sources: Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication operations in
MPICH" (binomial trees, recursive doubling, pairwise exchange); Patarasuk & Yuan 2009 (the ring).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distlab.collectives.all_reduce import hierarchical_all_reduce, recursive_doubling_all_reduce
from distlab.collectives.all_to_all import pairwise_all_to_all
from distlab.collectives.ring import ring_all_reduce
from distlab.collectives.segmented_ring import ring_all_gather, ring_reduce_scatter, segmented_ring_all_reduce
from distlab.collectives.trees import gather, scatter, tree_broadcast, tree_reduce


@dataclass(frozen=True)
class Algorithm:
    """One entry of ALGORITHMS: which collective it implements, the function, and a one-line summary.

    `needs` names required arguments beyond the collective's usual ones (the caller must supply them);
    `workspace`: it takes `workspace=`, a `Workspace` the caller keeps across calls for its buffers.
    """

    collective: str
    fn: Callable[..., Any]
    description: str
    needs: tuple[str, ...] = ()
    workspace: bool = False


ALGORITHMS: dict[str, Algorithm] = {
    "ring_all_reduce": Algorithm("all_reduce", ring_all_reduce,
                                 "textbook ring: p - 1 reduce-scatter then p - 1 all-gather steps, whole "
                                 "chunks (Patarasuk & Yuan 2009)"),
    "segmented_ring_all_reduce": Algorithm(
        "all_reduce", segmented_ring_all_reduce,
        "the same ring with chunks streamed in segments, receives posted ahead (as gloo's ring)",
        workspace=True),
    "recursive_doubling_all_reduce": Algorithm(
        "all_reduce", recursive_doubling_all_reduce,
        "log2 p exchanges of the whole vector with partners 2^k apart (Thakur et al. 2005)"),
    "hierarchical_all_reduce": Algorithm(
        "all_reduce", hierarchical_all_reduce,
        "tree reduce in each node, segmented ring across node leaders, tree broadcast in each node",
        needs=("ranks_per_node",)),
    "ring_reduce_scatter": Algorithm("reduce_scatter", ring_reduce_scatter,
                                     "p - 1 ring steps, each streaming on a partially reduced chunk",
                                     workspace=True),
    "ring_all_gather": Algorithm("all_gather", ring_all_gather,
                                 "p - 1 ring steps, each streaming on the block received last"),
    "tree_broadcast": Algorithm("broadcast", tree_broadcast, "binomial tree, ceil(log2 p) rounds (MPICH)"),
    "tree_reduce": Algorithm("reduce", tree_reduce,
                             "binomial tree run backwards, ceil(log2 p) rounds (MPICH)"),
    "tree_scatter": Algorithm("scatter", scatter, "binomial tree handing each subtree its block (MPICH)"),
    "tree_gather": Algorithm("gather", gather, "binomial tree collecting each subtree's block (MPICH)"),
    "pairwise_all_to_all": Algorithm("all_to_all", pairwise_all_to_all,
                                     "p - 1 steps, step k sends to rank + k and receives from rank - k"),
}
