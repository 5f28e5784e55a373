"""Which tokens each rank of a context-parallel group holds: the contiguous and the zig-zag layout.

The sequence of length L is cut into equal chunks. In the *contiguous* layout there are p chunks and
rank r holds chunk r. Under a causal mask, query chunk i attends to key chunks 0..i, so rank 0 has one
block of work and rank p-1 has p: the last rank sets the pace. In the *zig-zag* layout there are 2p
chunks and rank r holds chunks r and 2p-1-r, one from each end, so every rank has the same work,
2p + 1 half-size blocks (Brandon et al. 2023, "Striped Attention", discuss the imbalance; the zig-zag
pairing is the load balancing of Megatron-LM's context parallelism and of Dubey et al. 2024, sec. 3.3.2).

A rank's local tensor is its chunks concatenated in increasing order. `shard` and `unshard` move
between the full sequence and the local pieces; `block_kind` says which (query chunk, key chunk) pairs
are computed in full, on the diagonal (causal within the block) or skipped (entirely masked).
"""

from __future__ import annotations

import torch
from torch import Tensor

LAYOUTS = ("contiguous", "zigzag")
IGNORE_INDEX = -100  # F.cross_entropy's default: a target that adds nothing to the loss or its count


def check_layout(layout: str) -> str:
    """`layout`, checked against LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is unknown; choose one of {', '.join(LAYOUTS)}")
    return layout


def num_chunks(p: int, layout: str) -> int:
    """Chunks the sequence is cut into: p (contiguous) or 2p (zig-zag)."""
    return p if check_layout(layout) == "contiguous" else 2 * p


def chunk_ids(rank: int, p: int, layout: str) -> tuple[int, ...]:
    """The global chunk numbers rank `rank` of `p` holds, in increasing order: (r,) or (r, 2p-1-r)."""
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p={p!r} must be a positive number of ranks (the context-parallel group's size)")
    if not 0 <= rank < p:
        raise ValueError(f"rank={rank} is outside the group of p={p} ranks; use 0 .. {p - 1}")
    if check_layout(layout) == "contiguous":
        return (rank,)
    return (rank, 2 * p - 1 - rank)


def check_seq_len(seq_len: int, p: int, layout: str) -> int:
    """The chunk length, seq_len / num_chunks; a ValueError naming `seq_len` if it does not divide."""
    n = num_chunks(p, layout)
    if seq_len < n or seq_len % n:
        padded = max(n, -(-seq_len // n) * n)
        raise ValueError(f"seq_len={seq_len} is not a positive multiple of {n} ({layout} layout on p={p} "
                         f"ranks cuts the sequence into {n} equal chunks); pad the sequence at its end to "
                         f"{padded} tokens, the inputs with any token and the targets with "
                         f"ignore_index={IGNORE_INDEX} "
                         f"(pad_to_multiple(targets, p, layout, dim=1, value={IGNORE_INDEX})), so that "
                         "cp_gpt_loss counts only the real tokens (causal masking keeps them from "
                         "attending to the padding), or choose another cp size")
    return seq_len // n


def padded_length(seq_len: int, p: int, layout: str) -> int:
    """The smallest length >= seq_len that the layout can split: a multiple of p or 2p."""
    n = num_chunks(p, layout)
    return max(n, -(-seq_len // n) * n)


def pad_to_multiple(x: Tensor, p: int, layout: str, dim: int = -2, value: float = 0) -> Tensor:
    """`x` with `value` appended along `dim` up to `padded_length`. Under a causal mask a query never sees
    a later key, so padding at the end changes no real token's output; drop the padded rows after, or
    pad the targets with value=IGNORE_INDEX so that the loss skips them."""
    extra = padded_length(x.shape[dim], p, layout) - x.shape[dim]
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_full(shape, value)], dim=dim)


def positions(rank: int, p: int, seq_len: int, layout: str) -> Tensor:
    """The global token positions rank `rank` holds, in local order (for position embeddings)."""
    c = check_seq_len(seq_len, p, layout)
    return torch.cat([torch.arange(i * c, (i + 1) * c, device="cpu") for i in chunk_ids(rank, p, layout)])


def shard(x: Tensor, rank: int, p: int, layout: str, dim: int = -2) -> Tensor:
    """Rank `rank`'s piece of the full sequence `x` (sequence along `dim`): its chunks, concatenated."""
    c = check_seq_len(x.shape[dim], p, layout)
    return torch.cat([x.narrow(dim, i * c, c) for i in chunk_ids(rank, p, layout)], dim=dim)


def unshard(pieces: list[Tensor], layout: str, dim: int = -2) -> Tensor:
    """The full sequence from every rank's piece (`pieces[r]` from rank r): the inverse of `shard`."""
    p = len(pieces)
    chunks: dict[int, Tensor] = {}
    for r, piece in enumerate(pieces):
        ids = chunk_ids(r, p, layout)
        for i, part in zip(ids, piece.chunk(len(ids), dim=dim), strict=True):
            chunks[i] = part
    return torch.cat([chunks[i] for i in range(num_chunks(p, layout))], dim=dim)


def block_kind(q_chunk: int, k_chunk: int) -> str:
    """"full" (every key precedes every query), "diagonal" (the same chunk: causal within it) or "skip"
    (every key follows every query: entirely masked, not computed)."""
    if k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else "skip"
