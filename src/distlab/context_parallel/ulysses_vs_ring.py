"""Ulysses beside the ring on real ranks: the bytes each sends (counted by `distlab.comm_log`) and the
time of a forward and backward, with what the cost model predicts for both.

Run `measure` on every rank of a cp group. It times ring attention (Liu et al. 2023) and DeepSpeed-Ulysses
(Jacobs et al. 2023) on the same q, k, v (multi-head, a = a_kv: the course's ring passes K/V per query
head), and counts what each rank put on the wire in each phase. For the time model it calibrates this
machine first: the attention flops per second of one rank (dense causal attention on its share of the
work) and the bytes per second of one point-to-point message of the ring's K/V block size, then feeds
them to `cost_model.cp_attention_time`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab import launch, staged_p2p
from distlab.comm_log import comm_log
from distlab.context_parallel import cost_model
from distlab.context_parallel.ring import ring_attention
from distlab.context_parallel.ulysses import ulysses_attention
from distlab.mesh import group_rank, group_size
from distlab.timing import cuda_sync, median_seconds

SCHEMES = ("ring", "ulysses")


def _rank_device() -> torch.device:
    """This rank's device (`launch.device()`: its GPU under NCCL, which sends only CUDA tensors), or the
    CPU in a single process."""
    return launch.device() if dist.is_initialized() else torch.device("cpu")


def _median_time(step: Callable[[], None], repeats: int, group: dist.ProcessGroup | None) -> float:
    """Median seconds of `step` over `repeats` runs, each started together after a barrier (the slowest
    rank's time: what the next layer waits for)."""
    return median_seconds(step, repeats, warmup=0, group=group, barrier=True, over_ranks="max",
                          sync=cuda_sync(_rank_device()))  # CUDA kernels run asynchronously


def _calibrate(s: int, batch: int, heads: int, head_dim: int, dtype: torch.dtype,
               group: dist.ProcessGroup | None, repeats: int) -> tuple[float, float]:
    """(attention flops per second of this rank, bytes per second of one K/V-block message)."""
    p, r, dev = group_size(group), group_rank(group), _rank_device()
    q = torch.randn(batch, heads, s, head_dim, dtype=dtype, device=dev)
    dense = _median_time(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), repeats, None)
    flops = cost_model.attention_flops(s, batch, heads, head_dim) / dense
    if p == 1:
        return flops, float("inf")
    kv = torch.randn(2, batch, heads, s, head_dim, dtype=dtype, device=dev)
    buf = torch.empty_like(kv)

    def hop() -> None:
        reqs = [staged_p2p.isend(kv, group=group, group_dst=(r + 1) % p),
                staged_p2p.irecv(buf, group=group, group_src=(r - 1) % p)]
        for req in reqs:
            req.wait()

    return flops, kv.numel() * kv.element_size() / _median_time(hop, repeats, group)


def measure(seq_len: int = 512, batch: int = 1, heads: int = 8, head_dim: int = 32,
            dtype: torch.dtype = torch.float32, repeats: int = 3, layout: str = "zigzag",
            group: dist.ProcessGroup | None = None) -> dict:
    """Run on every rank of `group`: per scheme, the bytes this rank sent in each phase (comm_log),
    the modelled bytes, the measured seconds of forward + backward, and the modelled seconds from this
    machine's calibrated flops/s and bytes/s."""
    p = group_size(group)
    s = seq_len // p
    flops, bw = _calibrate(s, batch, heads, head_dim, dtype, group, repeats)
    q, k, v, dout = (torch.randn(batch, heads, s, head_dim, dtype=dtype, device=_rank_device())
                     for _ in range(4))
    e = q.element_size()
    out: dict = {"p": p, "seq_len": seq_len, "flops_per_s": flops, "bytes_per_s": bw}
    attend = {"ring": lambda a, b, c: ring_attention(a, b, c, group=group, layout=layout),
              "ulysses": lambda a, b, c: ulysses_attention(a, b, c, group=group, layout=layout)}
    model_bytes = {"ring": cost_model.bytes_per_rank(p, seq_len, batch, heads, head_dim, e),
                   "ulysses": cost_model.ulysses_bytes_per_rank(p, seq_len, batch, heads, heads, head_dim, e)}
    for scheme in SCHEMES:
        def step(fn: Callable = attend[scheme]) -> None:
            local = [t.clone().requires_grad_() for t in (q, k, v)]
            fn(*local).backward(dout)

        with comm_log() as log:
            step()
        ops = ("send",) if scheme == "ring" else ("all_to_all",)
        sent = {ph: log.sent_bytes(op=ops, phase=ph) for ph in ("forward", "backward")}
        kind = "ring" if scheme == "ring" else "ulysses"
        u, r = (1, p) if kind == "ring" else (p, 1)
        model_t = cost_model.cp_attention_time(kind, seq_len, batch, heads, heads, head_dim, e, flops,
                                               bw / 1e9 if p > 1 else 1.0, u=u, r=r)
        out[scheme] = {"sent": sent, "model_bytes": model_bytes[scheme],
                       "seconds": _median_time(step, repeats, group), "model_seconds": model_t["total"],
                       "model_exposed": model_t["exposed"]}
    return out
