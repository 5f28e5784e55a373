"""The activations ring attention saves for backward, measured with chapter 7's instruments.

`distlab.memory.measure.accounting.saved_activation_bytes` counts every storage an op saves for backward
(here: what `RingAttention.forward` passes to `save_for_backward`), each once. The prediction is
`cost_model.attention_saved_bytes`: q, k, v, out and one log-sum-exp per row, all L/p long. Chapter 7's
estimator (`distlab.memory.estimate.estimator`, `MemoryConfig(cp=...)`) divides the sequence by cp in the same
way; it counts the log-sum-exp in fp32 (what a flash-attention kernel keeps), while this implementation
keeps it in the dtype of q, so in float64 the two differ by b a (L/p) x 4 bytes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distlab import launch
from distlab.context_parallel.layouts import check_seq_len
from distlab.context_parallel.merge import block_attention
from distlab.context_parallel.ring import ring_attention
from distlab.memory.measure.accounting import saved_activation_bytes
from distlab.mesh import group_size


def measured_ring_bytes(seq_len: int, batch: int = 1, heads: int = 2, head_dim: int = 8,
                        layout: str = "zigzag", dtype: torch.dtype = torch.float64,
                        group: dist.ProcessGroup | None = None) -> int:
    """Run on every rank of `group`: bytes ring attention saves for backward on this rank."""
    p = group_size(group)
    check_seq_len(seq_len, p, layout)
    s = seq_len // p
    dev = launch.device() if dist.is_initialized() else torch.device("cpu")  # NCCL sends only CUDA tensors
    q, k, v = (torch.randn(batch, heads, s, head_dim, dtype=dtype, device=dev, requires_grad=True)
               for _ in range(3))
    return saved_activation_bytes(lambda: ring_attention(q, k, v, group=group, layout=layout))


def measured_dense_bytes(seq_len: int, batch: int = 1, heads: int = 2, head_dim: int = 8,
                         dtype: torch.dtype = torch.float64) -> int:
    """Bytes that unsplit attention written in plain PyTorch ops saves: the L x L matrices appear."""
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, dtype=dtype, requires_grad=True)
               for _ in range(3))
    return saved_activation_bytes(lambda: block_attention(q, k, v, causal=True))
