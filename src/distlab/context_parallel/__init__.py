"""Chapter 10: context parallelism. The sequence split over ranks, attention computed by ring attention.

Files, in reading order:
- `merge.py`: attention on one key block with its log-sum-exp, and the online-softmax merge of two
  partial results (Milakov & Gimelshein 2018; Dao et al. 2022).
- `layouts.py`: which chunks of the sequence each rank holds, contiguous or zig-zag; shard, unshard, pad.
- `ring.py`: `ring_attention`, the forward and backward rings (Liu et al. 2023), and `RingStats`.
- `layer.py`: the course GPT's attention on a cp group, and the GPT's loss computed with it.
- `cost_model.py`: work, bytes and saved memory per rank, in closed form.
- `saved_activations.py`: the saved activations of ring attention measured with chapter 7's tools.
- `parity.py`: ring attention and the GPT against dense causal attention on the same seed.
- `figures.py`, `exercises.py`, `__main__.py`: the lab's pictures, its checks, the command line.
- `ulysses.py`: DeepSpeed-Ulysses (Jacobs et al. 2023), all-to-alls between sequence and heads, and its
  hybrid with the ring (Fang & Zhao 2024); `ulysses_vs_ring.py`: both on ranks, bytes and time.
"""

from distlab.context_parallel.layer import RingSelfAttention, all_reduce_grads, cp_gpt_loss
from distlab.context_parallel.layouts import (
    LAYOUTS,
    chunk_ids,
    pad_to_multiple,
    padded_length,
    positions,
    shard,
    unshard,
)
from distlab.context_parallel.merge import block_attention, merge
from distlab.context_parallel.ring import RingAttention, RingStats, ring_attention
from distlab.context_parallel.ulysses import ulysses_attention

__all__ = ["LAYOUTS", "RingAttention", "RingSelfAttention", "RingStats", "all_reduce_grads",
           "block_attention", "chunk_ids", "cp_gpt_loss", "merge", "pad_to_multiple", "padded_length",
           "positions", "ring_attention", "shard", "unshard", "ulysses_attention"]
