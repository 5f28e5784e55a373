"""Chapter 5: tensor parallelism (Shoeybi et al. 2019, sec. 3) and sequence parallelism (Korthikanti et
al. 2022, sec. 4.2.2).

Every layer, the model and the parity check take `group=` (the tensor-parallel process group, e.g.
`mesh["tp"].get_group()`; None = the whole world, or one process without torch.distributed); rank and
size come from the group (`distlab.mesh.group_rank`, `group_size`). No signature carries a recorder: a
`distlab.comm_log` opened around a step records every collective, labelled with the layer's name. One
idea per file:

- `comm`: the autograd-aware operators `f`, `g`, `all_gather_seq`, `reduce_scatter_seq` and
  `gather_last_dim`.
- `layers`: `ColumnParallelLinear`, `RowParallelLinear`, `VocabParallelEmbedding`,
  `vocab_parallel_cross_entropy`, and the checks of sizes and token ids with their error messages.
- `model`: `ParallelMLP`, `ParallelSelfAttention`, `ParallelBlock`, `ParallelGPT`, and moving weights
  between the dense GPT and the shards (`shard_state_dict`, `gather_state_dict`).
- `parity`: one training step of the dense and the parallel model, compared (`compare_with_dense`),
  and its verdict against the dtype's tolerance.
- `cost_model`: the collectives of a step derived from the shapes, bytes on the wire, the ring cost model.
- `bench`: our parallel MLP timed beside PyTorch's ColwiseParallel / RowwiseParallel.
- `figures`: the chapter's pictures; `exercises`: the check of the lab's exercise.
- `collective_matmul`: the sequence-parallel all-gather and reduce-scatter decomposed into ring steps
  overlapped with the matmuls (Wang et al. 2023): `all_gather_matmul`, `matmul_reduce_scatter`,
  `overlap_collective_matmuls`; `overlap_cost`, when that pays; `overlap_bench`, blocking beside
  overlapped, measured with profiler traces.
- `python -m distlab.tensor_parallel` (also under torchrun): the parity check and the byte count.
"""

from distlab.tensor_parallel.collective_matmul import (
    all_gather_matmul,
    matmul_reduce_scatter,
    overlap_collective_matmuls,
)
from distlab.tensor_parallel.comm import (
    all_gather_seq,
    f,
    g,
    gather_last_dim,
    reduce_scatter_seq,
)
from distlab.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from distlab.tensor_parallel.model import (
    ParallelBlock,
    ParallelGPT,
    ParallelMLP,
    ParallelSelfAttention,
    gather_state_dict,
    shard_state_dict,
)
from distlab.tensor_parallel.parity import TPParityReport, compare_with_dense

__all__ = [
    "ColumnParallelLinear",
    "ParallelBlock",
    "ParallelGPT",
    "ParallelMLP",
    "ParallelSelfAttention",
    "TPParityReport",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "all_gather_seq",
    "compare_with_dense",
    "f",
    "g",
    "gather_last_dim",
    "gather_state_dict",
    "reduce_scatter_seq",
    "shard_state_dict",
    "vocab_parallel_cross_entropy",
    "all_gather_matmul",
    "matmul_reduce_scatter",
    "overlap_collective_matmuls",
]
