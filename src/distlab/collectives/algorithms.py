"""Tree, recursive-doubling, two-level and all-to-all collectives, built from point-to-point messages.

Every function runs inside a rank, uses only torch.distributed send/recv/isend/irecv on the default
group, and takes `ranks` (the participating global ranks; None = all), so that algorithms compose.
The ring algorithms live in `ring.py`, and the point-to-point helpers every algorithm shares in `p2p.py`.
Costs use the alpha-beta-gamma model: alpha per message, beta per byte sent, gamma per byte reduced; n is
the message size in bytes and p the number of ranks.

Sources: Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication operations in
MPICH" (binomial trees, recursive doubling, pairwise exchange); Patarasuk & Yuan 2009 (the ring).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from distlab.collectives.p2p import (
    exchange_reduce,
    flatten,
    participants,
    position_of,
    receive_pool,
    recv_all,
    reducer,
    send_all,
    write_back,
)
from distlab.collectives.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter

# Dtype codes and the largest number of dimensions scatter's shape header can carry.
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_MAX_DIMS = 16


def _subtree(vr: int, p: int) -> int:
    """Number of ranks in the binomial subtree rooted at relative rank vr (the root's is p)."""
    return p if vr == 0 else min(vr & -vr, p - vr)


def tree_broadcast(tensor: torch.Tensor, src: int = 0, ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Binomial-tree broadcast from global rank `src`, in place (MPICH; Thakur et al. 2005).

    Ranks are counted from the root (relative rank v = (pos - root) mod p). With L = ceil(log2 p), in
    round k = 0 .. L-1 every rank that already holds the data sends it 2^(L-1-k) ranks further on: half
    of the largest power of two >= p first, then a quarter, ..., then 1 (on 8 ranks: 0->4; 0->2, 4->6;
    0->1, 2->3, 4->5, 6->7). So the data reaches all p ranks in L rounds. Cost: ceil(log2 p) (alpha + n beta).
    """
    group, pos = participants(ranks)
    root = position_of(group, src, "src")
    flat = flatten(tensor)
    p = len(group)
    if p == 1 or flat.numel() == 0:
        return tensor
    vr = (pos - root) % p
    mask = 1
    while mask < p:  # receive once, from the rank that differs in my lowest set bit
        if vr & mask:
            recv_all(flat, group[(vr - mask + root) % p])
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # then send to every child below that bit, largest subtree first
        if vr + mask < p:
            send_all(flat, group[(vr + mask + root) % p])
        mask >>= 1
    return write_back(tensor, flat)


def tree_reduce(tensor: torch.Tensor, dst: int = 0, op: ReduceOp = ReduceOp.SUM,
                ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Binomial-tree reduce to global rank `dst` (MPICH; Thakur et al. 2005).

    The broadcast tree run backwards: each rank reduces what its children send, then sends the partial
    result to its parent. On `dst` the result is written into `tensor` in place; on the other ranks
    `tensor` is left unchanged (partial results live in a separate buffer).
    Cost: ceil(log2 p) (alpha + n beta + n gamma).
    """
    group, pos = participants(ranks)
    root = position_of(group, dst, "dst")
    reduce = reducer(op)
    flat = flatten(tensor)
    p = len(group)
    if p == 1 or flat.numel() == 0:
        return tensor
    vr = (pos - root) % p
    acc, pool = flat, None
    mask = 1
    while mask < p:
        if vr & mask:
            send_all(acc, group[(vr - mask + root) % p])
            break
        if vr + mask < p:
            pool = receive_pool(flat, flat.numel()) if pool is None else pool
            # the root reduces in place; other ranks first reduce out of place, keeping `tensor` intact
            target = acc if (vr == 0 or acc is not flat) else torch.empty_like(flat)
            exchange_reduce(flat[:0], -1, group[(vr + mask + root) % p], acc, target, reduce, pool)
            acc = target
        mask <<= 1
    return write_back(tensor, flat) if vr == 0 else tensor


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


def pairwise_all_to_all(inputs: Sequence[torch.Tensor], ranks: Sequence[int] | None = None, *,
                        output_split_sizes: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Pairwise-exchange all-to-all (Thakur et al. 2005): inputs[j] goes to the j-th rank
    of `ranks`; returns outputs where outputs[j] came from the j-th rank.

    In step k = 1 .. p-1 the rank at position i sends to (i + k) mod p and receives from (i - k) mod p,
    so every step is a permutation and no link carries two messages at once.
    Sizes may differ per destination (as in MoE token routing): the tensors must share dtype and all
    dimensions but the first. Receivers learn the first dimension from a one-number header sent with
    the data, unless the caller passes `output_split_sizes` (output_split_sizes[j] = rows coming from
    rank j), which skips the headers. Cost: (p - 1) alpha + (p - 1)/p n beta for n bytes per rank,
    plus (p - 1) alpha for the headers.
    """
    group, pos = participants(ranks)
    p = len(group)
    if not isinstance(inputs, Sequence) or len(inputs) != p or \
            not all(isinstance(t, torch.Tensor) for t in inputs):
        got = f"{len(inputs)} items" if isinstance(inputs, Sequence) else type(inputs).__name__
        raise ValueError(f"inputs must be a list of {p} tensors (one per rank in ranks), got {got}")
    mine = inputs[pos]
    if mine.dim() == 0:
        raise ValueError("inputs are 0-d tensors; all_to_all splits along dim 0: give them shape (n, ...)")
    rest, dtype = tuple(mine.shape[1:]), mine.dtype
    for j, t in enumerate(inputs):
        if t.dim() == 0 or tuple(t.shape[1:]) != rest or t.dtype != dtype:
            raise ValueError(f"inputs[{j}] has shape {tuple(t.shape)} and dtype {t.dtype}, but inputs[{pos}] "
                             f"has {tuple(mine.shape)} and {dtype}; all inputs must share the dtype and "
                             "every dimension but the first")
    if output_split_sizes is not None:
        sizes = list(output_split_sizes)
        if len(sizes) != p or any(not isinstance(s, int) or s < 0 for s in sizes) or sizes[pos] != len(mine):
            raise ValueError(f"output_split_sizes={sizes} must list {p} non-negative ints, one per rank "
                             f"in ranks, with entry {pos} equal to len(inputs[{pos}])={len(mine)}")
    outputs: list[torch.Tensor] = [torch.empty(0)] * p
    outputs[pos] = mine.clone()
    for k in range(1, p):
        dst, src = (pos + k) % p, (pos - k) % p
        data = inputs[dst].contiguous()
        works = []
        if output_split_sizes is None:  # the header goes first, then the data, on the same link
            header_in = torch.empty(1, dtype=torch.int64, device=mine.device)
            header_wait = dist.irecv(header_in, group[src])
            works.append(dist.isend(torch.tensor([len(data)], device=mine.device), group[dst]))
        if data.numel():
            works.append(dist.isend(data, group[dst]))
        if output_split_sizes is None:
            header_wait.wait()
            rows = int(header_in[0])
        else:
            rows = sizes[src]
        outputs[src] = mine.new_empty((rows, *rest))
        if outputs[src].numel():
            dist.irecv(outputs[src], group[src]).wait()
        for work in works:
            work.wait()
    return outputs


def scatter(chunks: Sequence[torch.Tensor] | None, src: int = 0,
            ranks: Sequence[int] | None = None) -> torch.Tensor:
    """Binomial-tree scatter (MPICH; Thakur et al. 2005): chunks[j] on `src` goes to the j-th
    rank of `ranks`. Returns this rank's chunk (a new tensor). `chunks` is read on `src` only.

    The root sends each child the block of chunks for that child's whole subtree, which splits it on.
    Chunks must share shape and dtype; a small shape header precedes each block, so other ranks need
    not know the shape. Cost: ceil(log2 p) alpha + (p - 1)/p n beta (n: bytes of all chunks).
    """
    group, pos = participants(ranks)
    root = position_of(group, src, "src")
    p = len(group)
    vr = (pos - root) % p
    if vr == 0:
        if chunks is None or isinstance(chunks, torch.Tensor) or len(chunks) != p:
            got = "None" if chunks is None else f"{len(chunks)} chunks"
            raise ValueError(f"chunks on src={src} must be a list of {p} tensors, one per rank in ranks; "
                             f"got {got}")
        first = chunks[0]
        if any(not isinstance(c, torch.Tensor) or c.shape != first.shape or c.dtype != first.dtype
               for c in chunks):
            raise ValueError(f"scatter chunks must all be tensors of one shape and dtype (chunks[0]: "
                             f"{tuple(first.shape)}, {first.dtype}); pad or split them evenly")
        if first.dim() > _MAX_DIMS or first.dtype not in _DTYPES:
            raise ValueError(f"scatter carries chunks of up to {_MAX_DIMS} dims of dtypes {_DTYPES}; "
                             f"got {first.dim()} dims of {first.dtype}")
        shape, dtype = tuple(first.shape), first.dtype
        block = torch.cat([chunks[(root + v) % p].reshape(-1) for v in range(p)])
    else:
        header = torch.empty(2 + _MAX_DIMS, dtype=torch.int64, device=_device())
        parent = group[(vr - (vr & -vr) + root) % p]
        dist.recv(header, parent)
        dtype, ndim = _DTYPES[int(header[0])], int(header[1])
        shape = tuple(int(s) for s in header[2:2 + ndim])
        block = torch.empty(_subtree(vr, p) * _numel(shape), dtype=dtype, device=header.device)
        recv_all(block, parent)
    m = _numel(shape)
    header = torch.tensor([_DTYPES.index(dtype), len(shape), *shape] + [0] * (_MAX_DIMS - len(shape)),
                          device=block.device)
    mask = (vr & -vr) >> 1 if vr else 1 << max(0, (p - 1).bit_length() - 1)
    while mask > 0:
        if vr + mask < p:
            child = group[(vr + mask + root) % p]
            dist.send(header, child)
            part = block[mask * m:(mask + _subtree(vr + mask, p)) * m]
            send_all(part, child)
        mask >>= 1
    mine = block[:m]
    return (mine.clone() if block.numel() > m else mine).view(shape)


def gather(tensor: torch.Tensor, dst: int = 0,
           ranks: Sequence[int] | None = None) -> list[torch.Tensor] | None:
    """Binomial-tree gather (MPICH; Thakur et al. 2005), the scatter tree run backwards.

    Each rank collects the blocks of its subtree from its children, then sends the whole block to its
    parent. Every rank must pass the same shape and dtype. Returns, on `dst`, the list of all ranks'
    tensors in `ranks` order (new tensors); None elsewhere. Cost: ceil(log2 p) alpha + (p - 1)/p n beta.
    """
    group, pos = participants(ranks)
    root = position_of(group, dst, "dst")
    flat = flatten(tensor)
    p, m = len(group), flat.numel()
    vr = (pos - root) % p
    size = _subtree(vr, p)
    block = flat.new_empty(size * m) if size > 1 or vr == 0 else flat
    if block is not flat:
        block[:m].copy_(flat)
    mask = 1
    while mask < p:
        if vr & mask:
            send_all(block, group[(vr - mask + root) % p])
            return None
        if vr + mask < p:
            part = block[mask * m:(mask + _subtree(vr + mask, p)) * m]
            recv_all(part, group[(vr + mask + root) % p])
        mask <<= 1
    pieces = [block[v * m:(v + 1) * m].view(tensor.shape) for v in range(p)]
    return [pieces[(j - root) % p] for j in range(p)]


def _device() -> torch.device:
    """Where messages must live: this rank's GPU on NCCL, the CPU on gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass(frozen=True)
class Algorithm:
    """One entry of ALGORITHMS: which collective it implements, the function, and a one-line summary.

    `needs` names required arguments beyond the collective's usual ones (the caller must supply them).
    """

    collective: str
    fn: Callable[..., Any]
    description: str
    needs: tuple[str, ...] = ()


ALGORITHMS: dict[str, Algorithm] = {
    "ring_all_reduce": Algorithm("all_reduce", ring_all_reduce,
                                 "ring reduce-scatter then ring all-gather (Patarasuk & Yuan 2009)"),
    "recursive_doubling_all_reduce": Algorithm(
        "all_reduce", recursive_doubling_all_reduce,
        "log2 p exchanges of the whole vector with partners 2^k apart (Thakur et al. 2005)"),
    "hierarchical_all_reduce": Algorithm(
        "all_reduce", hierarchical_all_reduce,
        "tree reduce in each node, ring across node leaders, tree broadcast in each node",
        needs=("ranks_per_node",)),
    "ring_reduce_scatter": Algorithm("reduce_scatter", ring_reduce_scatter,
                                     "p - 1 ring steps, each forwarding a partially reduced chunk"),
    "ring_all_gather": Algorithm("all_gather", ring_all_gather,
                                 "p - 1 ring steps, each forwarding the block received last"),
    "tree_broadcast": Algorithm("broadcast", tree_broadcast, "binomial tree, ceil(log2 p) rounds (MPICH)"),
    "tree_reduce": Algorithm("reduce", tree_reduce,
                             "binomial tree run backwards, ceil(log2 p) rounds (MPICH)"),
    "tree_scatter": Algorithm("scatter", scatter, "binomial tree handing each subtree its block (MPICH)"),
    "tree_gather": Algorithm("gather", gather, "binomial tree collecting each subtree's block (MPICH)"),
    "pairwise_all_to_all": Algorithm("all_to_all", pairwise_all_to_all,
                                     "p - 1 steps, step k sends to rank + k and receives from rank - k"),
}
