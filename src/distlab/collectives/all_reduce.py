"""All-reduce beyond the ring: recursive doubling, and the two-level (hierarchical) all-reduce.

Recursive doubling (Thakur, Rabenseifner & Gropp 2005) needs only log2 p steps, each
exchanging the whole vector: best for small messages. The two-level all-reduce composes the binomial
trees of `trees.py` inside each node with the ring of `ring.py` across node leaders, so that only leaders
cross the slow links. Both run inside a rank on the default group and take `ranks` (None = all).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed import ReduceOp

from distlab.collectives.p2p import (
    exchange_reduce,
    flatten,
    participants,
    receive_pool,
    recv_all,
    reducer,
    send_all,
    write_back,
)
from distlab.collectives.ring import ring_all_reduce
from distlab.collectives.trees import tree_broadcast, tree_reduce


def recursive_doubling_all_reduce(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
                                  ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Recursive-doubling all-reduce in place (Thakur et al. 2005).

    In step k each rank exchanges its whole vector with the rank whose position differs in bit k and
    reduces. When p is not a power of two, with p' the largest power of two below p and r = p - p':
    the first 2r ranks pair up, the even one folds its data into the odd one and sits out, the p'
    remaining ranks run recursive doubling, and the folded ranks get the result back at the end.
    Cost: log2 p (alpha + n beta + n gamma) for a power of two; otherwise
    (floor(log2 p) + 2) alpha + (floor(log2 p) + 2) n beta + (floor(log2 p) + 1) n gamma.
    """
    group, pos = participants(ranks)
    reduce = reducer(op)
    flat = flatten(tensor)
    p = len(group)
    if p == 1 or flat.numel() == 0:
        return tensor
    pof2 = 1 << (p.bit_length() - 1)
    extra = p - pof2
    pool = receive_pool(flat, flat.numel())
    if pos < 2 * extra and pos % 2 == 0:  # fold into the right neighbour, then wait for the answer
        send_all(flat, group[pos + 1])
        recv_all(flat, group[pos + 1])
        return write_back(tensor, flat)
    if pos < 2 * extra:
        exchange_reduce(flat[:0], -1, group[pos - 1], flat, flat, reduce, pool)
    new = pos // 2 if pos < 2 * extra else pos - extra  # position among the p' ranks that stay
    mask = 1
    while mask < pof2:
        partner = new ^ mask
        partner = group[2 * partner + 1 if partner < extra else partner + extra]
        # a op b == b op a bit for bit, so both partners (and in the end all ranks) hold identical results
        exchange_reduce(flat, partner, partner, flat, flat, reduce, pool, overlap=True)
        mask <<= 1
    if pos < 2 * extra:
        send_all(flat, group[pos - 1])
    return write_back(tensor, flat)


def hierarchical_all_reduce(tensor: torch.Tensor, ranks_per_node: int, op: ReduceOp = ReduceOp.SUM,
                            ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Two-level all-reduce in place: reduce inside each node, ring across nodes, broadcast inside.

    `ranks` is cut into consecutive nodes of `ranks_per_node` (the last one may be smaller); each node's
    first rank is its leader. 1) tree_reduce to the leader, 2) ring_all_reduce among the leaders,
    3) tree_broadcast from the leader. Only leaders cross the slow inter-node links (the idea behind
    NCCL's and Horovod's hierarchical all-reduce). With m ranks per node and N nodes:
    2 ceil(log2 m) (alpha + n beta_intra) + ceil(log2 m) n gamma
    + 2 (N - 1) alpha + 2 (N - 1)/N n beta_inter + (N - 1)/N n gamma.
    """
    group, pos = participants(ranks)
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise ValueError(f"ranks_per_node={ranks_per_node!r} must be an integer >= 1 (the number of "
                         "consecutive ranks that share a node), e.g. 2")
    reducer(op)
    flat = flatten(tensor)
    nodes = [group[i:i + ranks_per_node] for i in range(0, len(group), ranks_per_node)]
    node = nodes[pos // ranks_per_node]
    tree_reduce(flat, dst=node[0], op=op, ranks=node)
    if group[pos] == node[0]:
        ring_all_reduce(flat, op=op, ranks=[n[0] for n in nodes])
    tree_broadcast(flat, src=node[0], ranks=node)
    return write_back(tensor, flat)
