"""Chapter 5: tensor parallelism (Shoeybi et al. 2019, sec. 3) and sequence parallelism (Korthikanti et
al. 2022, sec. 4.2.2).

One idea per file:
- `comm`: the group (`TPGroup`), the `CommRecorder`, and the autograd-aware operators `f`, `g`,
  `all_gather_seq`, `reduce_scatter_seq` and `gather_last_dim`.
- `layers`: `ColumnParallelLinear`, `RowParallelLinear`, `VocabParallelEmbedding`,
  `vocab_parallel_cross_entropy`, and the divisibility check with its error message.
- `model`: `ParallelMLP`, `ParallelSelfAttention`, `ParallelBlock`, `ParallelGPT`, and moving weights
  between the dense GPT and the shards (`shard_state_dict`, `gather_state_dict`).
- `parity`: one training step of the dense and the parallel model, compared (`compare_with_dense`).
- `accounting`: the collectives of a step derived from the shapes, bytes on the wire, the ring cost model.
- `figures`: the chapter's pictures; `exercises`: the check of the lab's exercise.
- `python -m distlab.tensor_parallel` (also under torchrun): the parity check and the byte count.
"""

from distlab.tensor_parallel.comm import (
    CommRecord,
    CommRecorder,
    TPGroup,
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

__all__ = [
    "ColumnParallelLinear",
    "CommRecord",
    "CommRecorder",
    "ParallelBlock",
    "ParallelGPT",
    "ParallelMLP",
    "ParallelSelfAttention",
    "RowParallelLinear",
    "TPGroup",
    "VocabParallelEmbedding",
    "all_gather_seq",
    "f",
    "g",
    "gather_last_dim",
    "gather_state_dict",
    "reduce_scatter_seq",
    "shard_state_dict",
    "vocab_parallel_cross_entropy",
]
