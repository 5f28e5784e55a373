"""ZeRO's flat layout, and who sends which pieces of it to whom to rebuild whole matrices.

All tensors, flattened and concatenated in order (Muon's matrices first, then AdamW's tensors), padded
with zeros to N x s elements, s = ceil(total / N): rank r holds elements [r s, (r + 1) s), its shard
(Rajbhandari et al. 2020, ZeRO, sec. 5: each rank owns 1/N of every state). A matrix may straddle shards;
its *piece* on rank r is where its range meets r's shard, possibly empty.

To orthogonalise matrix m, its owner needs every rank's piece of m. `sends(rank)` lists, for each
destination q, the pieces of `rank`'s shard that belong to matrices q owns, in matrix order; `receives`
is the other side. Both ends compute the same plan from the same numbers, so an all-to-all with these
split sizes moves exactly the pieces and nothing else (no padding, no AdamW elements). The same plan,
reversed, takes the orthogonalised pieces back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Piece = tuple[int, int, int]  # (tensor index, start, stop) in the flat buffer's coordinates


@dataclass(frozen=True)
class FlatLayout:
    """`numels` of the tensors in flat order, cut into `world` shards."""

    numels: tuple[int, ...]
    world: int

    def __post_init__(self) -> None:
        if self.world < 1:
            raise ValueError(f"world={self.world} must be a positive number of ranks")

    @property
    def total(self) -> int:
        return sum(self.numels)

    @property
    def shard(self) -> int:
        """s, the elements of every rank's shard (the last ones padded)."""
        return -(-self.total // self.world)

    @property
    def padded(self) -> int:
        return self.shard * self.world

    def offset(self, i: int) -> int:
        """Where tensor i starts in the flat buffer."""
        return sum(self.numels[:i])

    def piece(self, i: int, rank: int) -> tuple[int, int]:
        """Tensor i's piece on `rank`: (start, stop) in flat coordinates, start == stop when empty."""
        lo, hi = self.offset(i), self.offset(i) + self.numels[i]
        start, stop = max(lo, rank * self.shard), min(hi, (rank + 1) * self.shard)
        return (start, stop) if start < stop else (start, start)

    def local(self, i: int, rank: int) -> tuple[int, int]:
        """Tensor i's piece on `rank` in that shard's own coordinates."""
        start, stop = self.piece(i, rank)
        return start - rank * self.shard, stop - rank * self.shard

    def sends(self, rank: int, matrices: Sequence[int], owners: Sequence[int]) -> list[list[Piece]]:
        """For each destination q: `rank`'s non-empty pieces of the `matrices` that q owns."""
        out: list[list[Piece]] = [[] for _ in range(self.world)]
        for m, q in zip(matrices, owners, strict=True):
            start, stop = self.piece(m, rank)
            if stop > start:
                out[q].append((m, start, stop))
        return out

    def receives(self, rank: int, matrices: Sequence[int], owners: Sequence[int]) -> list[list[Piece]]:
        """For each source r: r's non-empty pieces of the matrices that `rank` owns."""
        return [self.sends(r, matrices, owners)[rank] for r in range(self.world)]


def elements(pieces: Sequence[Piece]) -> int:
    """The elements in `pieces`."""
    return sum(stop - start for _, start, stop in pieces)
