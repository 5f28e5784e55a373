"""This rank's part of the course's GPT on a dp x pp x tp mesh, named as the dense GPT names it.

Built from chapter 5 and chapter 4, not copied: `ParallelGPT.from_dense` (chapter 5) cuts the dense
GPT's weights into this rank's tensor-parallel shard (`group=` the tp group), and this file keeps the
modules of this rank's pipeline stage (chapter 4's cut of a GPT into [embedding, blocks..., head]):

- `Embed`: chapter 5's `VocabParallelEmbedding` plus the position embedding (stage 0);
- the `ParallelBlock`s of the stage (`config.block_ranges`);
- `Head`: the final LayerNorm and the output layer, which reuses the embedding's vocabulary shard (tied
  weights, Press & Wolf 2017); its logits stay split over the vocabulary, and the loss is chapter 5's
  `vocab_parallel_cross_entropy` (last stage). With pp > 1 the first and the last stage each hold a copy
  of the tied shard, kept equal by chapter 4's `tie_embedding_gradients`.

`StageModel` holds them under the dense names (`wte.weight`, `h.3.mlp.c_fc.weight`, `ln_f.bias`), and
`named_shards` lists, for each local parameter, its dense name, its local tensor, the dim it is split
along over tp (None if replicated), c_attn's 3 chunks and the tied copy: `checkpoint.ShardedParam`, the
contract the checkpoint code builds on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distlab.mesh import group_rank, group_size
from distlab.models import GPT
from distlab.parallel3d.checkpoint import ShardedParam
from distlab.parallel3d.checkpoint.contract import tp_split
from distlab.parallel3d.config import block_ranges
from distlab.tensor_parallel import ParallelGPT, all_gather_seq, f
from distlab.tensor_parallel.comm import Group


class Embed(nn.Module):
    """Token (vocabulary-parallel) plus position embedding; with sequence parallelism this rank's T/tp
    positions (Korthikanti et al. 2022, sec. 4.2.2)."""

    def __init__(self, wte: nn.Module, wpe: nn.Embedding, sequence_parallel: bool, group: Group) -> None:
        super().__init__()
        self.wte, self.wpe, self.sequence_parallel, self.group = wte, wpe, sequence_parallel, group

    def forward(self, idx: Tensor) -> Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        if self.sequence_parallel:
            p, r = group_size(self.group), group_rank(self.group)
            pos = pos[r * (T // p):(r + 1) * (T // p)]
        return self.wte(idx) + self.wpe(pos)


class Head(nn.Module):
    """Final LayerNorm and the tied output layer: this rank's vocabulary slice of the logits."""

    def __init__(self, ln_f: nn.LayerNorm, wte: nn.Module, sequence_parallel: bool, group: Group) -> None:
        super().__init__()
        self.ln_f, self.wte, self.group = ln_f, wte, group
        self.enter = all_gather_seq if sequence_parallel else f

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(self.enter(self.ln_f(x), self.group, "lm_head"), self.wte.weight)


class StageModel(nn.Module):
    """The parameters of pipeline stage `stage` of `pp`, tp shard of this rank, under the dense names;
    `layers` is the stage as a list for chapter 4's executor."""

    def __init__(self, parallel: ParallelGPT, stage: int, pp: int, dense_shapes: dict[str, tuple[int, ...]]
                 ) -> None:
        super().__init__()
        self.stage, self.pp, self.dense_shapes = stage, pp, dense_shapes
        self.blocks = block_ranges(parallel.config.n_layer, pp)[stage]
        sp, group = parallel.sequence_parallel, parallel.group
        self.h = nn.ModuleDict({str(i): parallel.h[i] for i in self.blocks})
        self.layers: list[nn.Module] = [*self.h.values()]
        self.is_first, self.is_last = stage == 0, stage == pp - 1
        if self.is_first or self.is_last:
            self.wte = parallel.wte
        if self.is_first:
            self.wpe = parallel.wpe
            self.layers.insert(0, Embed(parallel.wte, parallel.wpe, sp, group))
        if self.is_last:
            self.ln_f = parallel.ln_f
            self.layers.append(Head(parallel.ln_f, parallel.wte, sp, group))
        self.parallel = [parallel]  # a list, so that its other stages' parameters are not registered here

    def sequence_parallel_grads(self) -> None:
        """Sum the gradients of the replicated parameters over tp (chapter 5, with sequence parallelism)."""
        self.parallel[0].allreduce_sequence_parallel_grads()


def build_stage(dense: GPT, stage: int, pp: int, tp_group: Group = None,
                sequence_parallel: bool = False) -> StageModel:
    """Stage `stage` of `pp` of the dense GPT, this rank's tensor-parallel shard of it (position in
    `tp_group`), via chapter 5's `ParallelGPT.from_dense` (Narayanan et al. 2021, sec. 2-3)."""
    parallel = ParallelGPT.from_dense(dense, group=tp_group, sequence_parallel=sequence_parallel)
    shapes = {n: tuple(p.shape) for n, p in dense.named_parameters()}
    return StageModel(parallel, stage, pp, shapes)


def named_shards(model: StageModel) -> list[ShardedParam]:
    """Every local parameter of `model` as the checkpoint contract sees it (`checkpoint.ShardedParam`):
    its dense name, its tensor, the dim split over tp and c_attn's 3 chunks (`tp_split`), and whether it
    is the last stage's copy of the tied embedding."""
    out = []
    for name, p in model.named_parameters():
        dim, chunks = tp_split(name)
        dense = model.dense_shapes[name]
        if any(a != b for d, (a, b) in enumerate(zip(p.shape, dense, strict=True)) if d != dim):
            raise ValueError(f"parameter {name!r} has local shape {tuple(p.shape)} but the dense shape "
                             f"{dense} differs outside its tp dim {dim}; tp_split does not describe how "
                             "this model is sharded: extend tp_split for it")
        tied = name == "wte.weight" and model.is_last and not model.is_first
        out.append(ShardedParam(name, p.data, dim, chunks, tied))
    return out
