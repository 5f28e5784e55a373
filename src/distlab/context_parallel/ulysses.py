"""DeepSpeed-Ulysses: context parallelism by two all-to-alls, and its hybrid with the ring.

Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme Long
Sequence Transformer Models" (arXiv 2309.14509), sec. 3: each of the p ranks holds L/p tokens of q, k
and v for *all* a heads. One all-to-all turns that into *all* L tokens for a/p heads: rank r sends its
tokens of head group j to rank j and receives, from every rank, that rank's tokens of head group r.
Each rank then runs ordinary (dense, causal) attention on whole sequences of its heads, since heads
never mix, and a second all-to-all sends the output back to the sequence layout, where the output
projection and the MLP need it. The heads must split over the ranks: a % p == 0, and under grouped-query
attention (GQA; Ainslie et al. 2023) the key/value heads too, a_kv % p == 0.

An all-to-all with equal splits is a permutation of the chunks (chunk j of rank r goes to slot r of
rank j), and its transpose, the backward, is the same exchange run on the gradients: the inverse
all-to-all (`AllToAll.backward`). So autograd needs nothing else: dq, dk, dv come back to the sequence
layout through the transposes of the forward's two exchanges.

The hybrid (Fang & Zhao 2024, "USP: A Unified Sequence Parallelism Approach for Long Context
Generative AI", arXiv 2405.07719): cp = u x r ranks, Ulysses over u ranks (inside a node, on the fast
links) and ring attention (Liu et al. 2023) over r ranks (across nodes). The sequence is first cut by
the ring's layout into r shards, and each shard into u contiguous pieces, one per rank of a Ulysses
group; after the all-to-all, each rank holds its ring shard whole for a/u heads and runs
`ring.ring_attention` over the ring group. Only a_kv % u == 0 is needed, so the head count no longer
caps the cp size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from distlab.context_parallel.layouts import check_layout, check_seq_len, shard, unshard
from distlab.context_parallel.ring import ring_attention
from distlab.mesh import group_rank, group_size


class AllToAll(torch.autograd.Function):
    """`dist.all_to_all_single` of a (p, ...) buffer: slot j goes to rank j, slot j of the result came
    from rank j. With equal splits it is its own inverse, so the backward runs it on the gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:  # type: ignore[override]
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return _exchange(grad, ctx.group), None


def _exchange(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    x = x.contiguous()
    if group_size(group) == 1:
        return x.clone()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def check_heads(heads: int, kv_heads: int, p: int, what: str = "Ulysses group") -> None:
    """A ValueError naming `heads` or `kv_heads` unless both split evenly over the p ranks."""
    for name, n in (("heads", heads), ("kv_heads", kv_heads)):
        if n % p:
            options = [d for d in range(1, n + 1) if n % d == 0]
            raise ValueError(f"{name}={n} is not divisible by the {what}'s size p={p}: Ulysses gives each "
                             f"rank whole heads; choose p among {options} (divisors of {name}), or run "
                             "the rest of the cp size as a ring (the hybrid: ulysses_attention(..., "
                             "ring_group=...))")
    if heads % kv_heads:
        raise ValueError(f"heads={heads} is not a multiple of kv_heads={kv_heads}; grouped-query attention "
                         "shares each key/value head among heads // kv_heads query heads")


def seq_to_heads(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """(B, a, S, d) with this rank's S tokens of all a heads -> (B, a/p, p S, d): every rank's tokens (in
    rank order) of this rank's a/p heads. The first all-to-all of Jacobs et al. 2023, fig. 2."""
    p = group_size(group)
    B, a, S, d = x.shape
    buf = x.reshape(B, p, a // p, S, d).transpose(0, 1)  # slot j: head group j
    out = AllToAll.apply(buf, group)  # slot j: rank j's tokens of my head group
    return out.permute(1, 2, 0, 3, 4).reshape(B, a // p, p * S, d)


def heads_to_seq(y: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """The inverse: (B, a/p, p S, d) in rank order -> (B, a, S, d), this rank's tokens of every head."""
    p = group_size(group)
    B, h, L, d = y.shape
    buf = y.reshape(B, h, p, L // p, d).permute(2, 0, 1, 3, 4)  # slot j: rank j's tokens
    out = AllToAll.apply(buf, group)  # slot j: my tokens of head group j
    return out.transpose(0, 1).reshape(B, p * h, L // p, d)


def _dense_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax(q k^T / sqrt(d)) v on whole sequences, kv heads shared as GQA prescribes."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup | None = None,
                      layout: str = "zigzag", ring_group: dist.ProcessGroup | None = None) -> Tensor:
    """Causal attention over the whole sequence by DeepSpeed-Ulysses (Jacobs et al. 2023).

    q (B, a, S_local, d); k, v (B, a_kv, S_local, d) with a_kv dividing a (GQA); this rank holds the
    tokens `layouts.shard(x, r, p, layout)` gives it. group: the Ulysses group (None: the whole world).

    ring_group: the hybrid of USP (Fang & Zhao 2024): ring attention over `ring_group` (r ranks) after
    the all-to-all over `group` (u ranks). Then the sequence is cut by `layout` into r ring shards, and
    rank (ring position i, Ulysses position j) holds the j-th of u contiguous pieces of shard i.
    """
    check_layout(layout)
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[::2] != k.shape[::2]:
        raise ValueError(f"q must be (B, a, S_local, d) and k, v (B, a_kv, S_local, d); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}; split heads before "
                         "calling")
    u = group_size(group)
    group_rank(group, "Ulysses group")
    check_heads(q.shape[1], k.shape[1], u)
    if ring_group is None:
        check_seq_len(u * q.shape[2], u, layout)
        qh, kh, vh = (unshard(list(seq_to_heads(t, group).chunk(u, dim=2)), layout) for t in (q, k, v))
        y = _dense_causal(qh, kh, vh)
        return heads_to_seq(torch.cat([shard(y, j, u, layout) for j in range(u)], dim=2), group)
    r = group_size(ring_group)
    check_seq_len(r * u * q.shape[2], r, layout)
    qh, kh, vh = (seq_to_heads(t, group) for t in (q, k, v))  # this rank's ring shard, a/u heads
    rep = qh.shape[1] // kh.shape[1]
    if rep > 1:  # ring_attention passes K/V of every query head
        kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
    y = ring_attention(qh, kh, vh, group=ring_group, layout=layout)
    return heads_to_seq(y, group)


def hybrid_shard(x: Tensor, ring_rank: int, r: int, ulysses_rank: int, u: int, layout: str = "zigzag",
                 dim: int = -2) -> Tensor:
    """The tokens of rank (ring position `ring_rank` of r, Ulysses position `ulysses_rank` of u) in the
    hybrid: its ring shard under `layout`, then the `ulysses_rank`-th of u contiguous pieces of it."""
    piece = shard(x, ring_rank, r, layout, dim=dim)
    n = piece.shape[dim]
    if n % u:
        raise ValueError(f"a ring shard of {n} tokens does not split into u={u} equal pieces; make seq_len "
                         f"a multiple of {u} x the ring layout's chunk count")
    return piece.narrow(dim, ulysses_rank * (n // u), n // u)
