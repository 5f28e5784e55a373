"""How a global batch is cut among data-parallel ranks: the same batch on every rank, then one slice each.

`batch_indices` is PyTorch's DistributedSampler idea (one permutation per epoch from seed + epoch, the
same on every rank), and `shard` is the contiguous slice of that batch a rank trains on (`uneven_shard`
where the batch need not divide: the first ranks take one item more). Every chapter
that trains on data (2, 3, 7, 9) uses these two, so that "which examples did rank r see at step t" has one
answer in the whole course.
"""

from __future__ import annotations

import torch
from torch import Tensor


def batch_indices(n_items: int, batch_size: int, step: int, seed: int) -> Tensor:
    """The indices of the global batch for `step`: the same on every rank that passes the same seed.

    As PyTorch's DistributedSampler does with `set_epoch`, each epoch is a fresh permutation drawn with
    seed + epoch; step t takes the next `batch_size` indices of it (a last partial batch is dropped).
    """
    if not 0 < batch_size <= n_items:
        raise ValueError(f"batch_size={batch_size} must be between 1 and n_items={n_items}; "
                         f"pick a batch of at most {n_items}")
    steps_per_epoch = n_items // batch_size
    epoch, i = divmod(step, steps_per_epoch)
    perm = torch.randperm(n_items, generator=torch.Generator().manual_seed(seed + epoch))
    return perm[i * batch_size:(i + 1) * batch_size]


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world size {world_size} must be at least 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} for world size {world_size}")


def shard(n_items: int, rank: int, world_size: int) -> slice:
    """Rank `rank`'s contiguous slice of a global batch of `n_items`: items [rank k, (rank + 1) k) with
    k = n_items / world_size. The slices of ranks 0..world_size-1 are disjoint and cover the batch."""
    _check_rank(rank, world_size)
    if n_items % world_size:
        raise ValueError(f"global batch {n_items} is not divisible by world size {world_size}; "
                         f"pick a batch that is a multiple of {world_size}")
    k = n_items // world_size
    return slice(rank * k, (rank + 1) * k)


def uneven_shard(n_items: int, rank: int, world_size: int) -> slice:
    """Rank `rank`'s contiguous slice of a global batch of `n_items` that need not divide: with
    n_items = q world_size + e, ranks 0..e-1 take q + 1 items and the others q (the rule of
    `torch.tensor_split`); the same slice as `shard` when it divides. Every rank gets at least one item."""
    _check_rank(rank, world_size)
    if n_items < world_size:
        raise ValueError(f"global batch {n_items} is smaller than world size {world_size}, so some rank "
                         f"would train on nothing; pick a batch of at least {world_size}")
    q, extra = divmod(n_items, world_size)
    start = rank * q + min(rank, extra)
    return slice(start, start + q + (rank < extra))
