"""All-to-all by pairwise exchange: every rank sends a (possibly different-sized) block to every other.

Thakur, Rabenseifner & Gropp 2005: in step k each rank sends to the rank k ahead and receives
from the rank k behind, so every step is a permutation. Uneven sizes are what MoE token routing needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from distlab.collectives.p2p import participants


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
