"""The one contract of chapter 9's checkpoints: what a trainer hands `store.save` and `store.load`.

`ShardedParam`: for each local parameter (or a piece of optimizer state shaped like it), its name in the
dense GPT, its local tensor, the dim it is split along over tp (None: replicated), into how many equal
chunks that dim is cut before the split (3 for c_attn's packed [q | k | v], whose tp slice is
[q_r | k_r | v_r]), and whether it is the last pipeline stage's copy of the tied embedding (saved once,
by stage 0; loaded into both copies). `model.named_shards` and `train.Trainer.params` both return it.
`Checkpointable`: what a trainer offers (`parallel3d.train.Trainer3D` and `checkpoint.train.Trainer`).
`tp_split`: the (dim, chunks) of each parameter of chapter 5's tensor-parallel GPT, which both trainers
hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from distlab.tensor_parallel.model import placement


@dataclass(frozen=True)
class ShardedParam:
    """One local parameter (or a piece of optimizer state shaped like it): its dense `name`, this rank's
    `local` tensor, the dim `dim` of the dense tensor it is split along over tp (None: replicated),
    `chunks`: that dim is first cut into this many equal parts, each split over tp (3 for c_attn's packed
    [q | k | v], Shoeybi et al. 2019 sec. 3; 1 otherwise), and `tied_copy`: the last pipeline stage's
    copy of the tied embedding (the same values as stage 0's `wte.weight`: saved once, loaded twice)."""

    name: str
    local: Tensor
    dim: int | None
    chunks: int = 1
    tied_copy: bool = False

    def stored(self) -> tuple[Tensor, int | None]:
        """The local tensor as it is stored, and its split dim: a chunked dim d of size c*n becomes the
        two dims (c, n) and the split moves to d + 1 (a view: writing into it writes the parameter)."""
        if self.chunks == 1 or self.dim is None:
            return self.local, self.dim
        shape = self.local.shape
        d = self.dim
        return self.local.view(*shape[:d], self.chunks, shape[d] // self.chunks, *shape[d + 1:]), d + 1


class Checkpointable(Protocol):
    """What `save` and `load` need from a trainer (`train.Trainer3D`, or the dp x tp
    `checkpoint.train.Trainer`)."""

    step: int

    def params(self) -> list[ShardedParam]: ...

    def optimizer_state(self) -> dict[str, list[ShardedParam]]: ...

    def load_optimizer_state(self, state: dict[str, dict[str, Tensor]], steps: int) -> None: ...


def tp_split(name: str) -> tuple[int | None, int]:
    """How chapter 5's `ParallelGPT` splits the dense parameter `name` over tp, as (dim, chunks): what the
    layer that holds it declares (`tensor_parallel.model.placement`): the vocabulary rows of wte and the
    output rows of c_fc along dim 0, the input columns of c_proj along dim 1; c_attn packs
    [q_r | k_r | v_r], so its dim 0 is cut into 3 chunks, each split over tp; (None, 1) when replicated.
    By name, not by shape, so that the stored layout is the same for every tp, 1 included."""
    pl = placement(name)
    return pl.dim, pl.chunks
