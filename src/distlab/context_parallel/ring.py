"""Ring attention: causal self-attention with the sequence split over a context-parallel group.

Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context":
each of the p ranks keeps its own query block and passes key/value blocks around a ring. At step
s = 0 .. p-1, rank r holds the K/V block of rank (r - s) mod p; it starts sending that block to rank
r+1 (and receiving the next one from rank r-1) *before* computing with it, so the transfer overlaps the
compute, and it merges the block's partial result into its running output with the online softmax
(`merge.merge`; Dao et al. 2022). Blocks entirely above the causal diagonal are skipped (`layouts`).

The backward pass (a `torch.autograd.Function`) keeps only q, k, v, the output and the log-sum-exp
per row; it recomputes each block's probabilities from the saved log-sum-exp, as FlashAttention's
backward does (Dao et al. 2022, sec. 3.1 and App. B.2), and passes K/V around the ring again. The
gradient dK, dV of a key block is accumulated where the block travels: rank j adds its own part at home,
the accumulator is born on rank j+1 and hops with the block, and its last hop brings it home. So forward
sends K, V (p-1 times) and backward sends K, V (p-1 times) and dK, dV (p-1 times) per rank.

`RingStats` records, on the rank that owns it, the blocks computed and the bytes of every send.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from distlab import staged_p2p
from distlab.context_parallel.layouts import block_kind, check_layout, check_seq_len, chunk_ids
from distlab.context_parallel.merge import block_attention, merge
from distlab.mesh import group_rank, group_size


@dataclass
class RingStats:
    """What one rank did: blocks computed (by kind), score entries computed, bytes sent per pass."""

    blocks: dict[str, int] = field(default_factory=lambda: {"full": 0, "diagonal": 0, "skip": 0})
    score_entries: int = 0  # elements of Q K^T computed in the forward pass (masked ones included)
    bytes_forward: int = 0
    bytes_backward: int = 0

    @property
    def computed(self) -> int:
        """Blocks computed in the forward pass (full + diagonal)."""
        return self.blocks["full"] + self.blocks["diagonal"]


def _exchange(tensors: list[Tensor], group: dist.ProcessGroup | None, stats: RingStats | None,
              phase: str) -> tuple[list[Tensor], list[dist.Work]]:
    """Start sending `tensors` to the next rank of the ring and receiving the same shapes from the
    previous one; return the receive buffers and the requests to wait on."""
    p, r = group_size(group), group_rank(group)
    tensors = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    requests = []
    for t, buf in zip(tensors, received, strict=True):
        requests.append(staged_p2p.isend(t, group=group, group_dst=(r + 1) % p))
        requests.append(staged_p2p.irecv(buf, group=group, group_src=(r - 1) % p))
        if stats is not None:
            nbytes = t.numel() * t.element_size()
            if phase == "forward":
                stats.bytes_forward += nbytes
            else:
                stats.bytes_backward += nbytes
    return received, requests


def _wait(requests: list[dist.Work]) -> None:
    for req in requests:
        req.wait()


def ring_forward(q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup | None, layout: str,
                 stats: RingStats | None = None) -> tuple[Tensor, Tensor]:
    """The forward ring without autograd: this rank's output (..., S_local, D) and log-sum-exp."""
    p, r = group_size(group), group_rank(group, "context-parallel group")
    ids = chunk_ids(r, p, layout)
    n = len(ids)
    q_parts = q.chunk(n, dim=-2)
    outs: list[Tensor | None] = [None] * n
    lses: list[Tensor | None] = [None] * n
    cur = [k, v]
    for s in range(p):
        src = (r - s) % p
        nxt, reqs = _exchange(cur, group, stats, "forward") if s < p - 1 else (cur, [])
        for i, (a, qa) in enumerate(zip(ids, q_parts, strict=True)):
            for b, kb, vb in zip(chunk_ids(src, p, layout), cur[0].chunk(n, -2), cur[1].chunk(n, -2),
                                 strict=True):
                kind = block_kind(a, b)
                if stats is not None:
                    stats.blocks[kind] += 1
                if kind == "skip":
                    continue
                if stats is not None:
                    stats.score_entries += qa.shape[-2] * kb.shape[-2]
                o, lse = block_attention(qa, kb, vb, causal=kind == "diagonal")
                prev_o, prev_lse = outs[i], lses[i]
                if prev_o is None or prev_lse is None:
                    outs[i], lses[i] = o, lse
                else:
                    outs[i], lses[i] = merge(prev_o, prev_lse, o, lse)
        _wait(reqs)
        cur = nxt
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)  # type: ignore[arg-type]


def _block_grads(qa: Tensor, kb: Tensor, vb: Tensor, do: Tensor, lse: Tensor, delta: Tensor,
                 causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV of one block, recomputing P = exp(S - lse) (Dao et al. 2022, App. B.2, eq. 4)."""
    scale = 1.0 / math.sqrt(qa.shape[-1])
    scores = (qa @ kb.transpose(-2, -1)) * scale
    if causal:
        mask = torch.ones(qa.shape[-2], kb.shape[-2], dtype=torch.bool, device=qa.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    prob = torch.exp(scores - lse.unsqueeze(-1))
    dv = prob.transpose(-2, -1) @ do
    ds = prob * (do @ vb.transpose(-2, -1) - delta.unsqueeze(-1))
    return (ds @ kb) * scale, (ds.transpose(-2, -1) @ qa) * scale, dv


def _step_grads(ids: tuple[int, ...], src_ids: tuple[int, ...], cur: list[Tensor], rows: tuple,
                dq: list[Tensor]) -> list[Tensor]:
    """One step of the backward ring: add this rank's dQ of every block into `dq`; return the dK, dV that
    this rank's queries give the K/V blocks it holds now (`rows`: its q, dO, lse and delta, per chunk)."""
    q_parts, do_parts, lse_parts, delta_parts = rows
    n = len(ids)
    dk = [torch.zeros_like(t) for t in cur[0].chunk(n, -2)]
    dv = [torch.zeros_like(t) for t in cur[1].chunk(n, -2)]
    for i, a in enumerate(ids):
        for j, (b, kb, vb) in enumerate(zip(src_ids, cur[0].chunk(n, -2), cur[1].chunk(n, -2), strict=True)):
            kind = block_kind(a, b)
            if kind == "skip":
                continue
            gq, gk, gv = _block_grads(q_parts[i], kb, vb, do_parts[i], lse_parts[i], delta_parts[i],
                                      kind == "diagonal")
            dq[i] += gq
            dk[j] += gk
            dv[j] += gv
    return [torch.cat(dk, -2), torch.cat(dv, -2)]


def ring_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
                  group: dist.ProcessGroup | None, layout: str,
                  stats: RingStats | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The backward ring: dQ, dK, dV of this rank's blocks, K/V and the dK/dV accumulators on the ring."""
    p, r = group_size(group), group_rank(group)
    ids = chunk_ids(r, p, layout)
    n = len(ids)
    delta = (dout * out).sum(-1)  # D_i = rowsum(dO * O)
    q_parts = q.chunk(n, -2)
    rows = (q_parts, dout.chunk(n, -2), lse.chunk(n, -1), delta.chunk(n, -1))  # per chunk: q, dO, lse, D
    dq = [torch.zeros_like(t) for t in q_parts]
    cur = [k, v]
    own: list[Tensor] = []
    acc: list[Tensor] = []
    acc_reqs: list[dist.Work] = []
    for s in range(p):
        src = (r - s) % p
        nxt, reqs = _exchange(cur, group, stats, "backward") if s < p - 1 else (cur, [])
        contribution = _step_grads(ids, chunk_ids(src, p, layout), cur, rows, dq)
        if s == 0:
            own = contribution
        else:  # the accumulator of block src: born here at step 1, else received at the last step
            _wait(acc_reqs)
            acc = contribution if s == 1 else [a + c for a, c in zip(acc, contribution, strict=True)]
            acc, acc_reqs = _exchange(acc, group, stats, "backward")  # the last hop brings it home
        _wait(reqs)
        cur = nxt
    _wait(acc_reqs)
    dk_total, dv_total = (own[0] + acc[0], own[1] + acc[1]) if p > 1 else (own[0], own[1])
    return torch.cat(dq, -2), dk_total, dv_total


class RingAttention(torch.autograd.Function):
    """Causal ring attention as an autograd function: saves q, k, v, out and the log-sum-exp only."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup | None,  # type: ignore[override]
                layout: str, stats: RingStats | None) -> Tensor:
        out, lse = ring_forward(q, k, v, group, layout, stats)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.layout, ctx.stats = group, layout, stats
        return out

    @staticmethod
    def backward(ctx, dout: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, out, lse, dout.contiguous(), ctx.group, ctx.layout, ctx.stats)
        return dq, dk, dv, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup | None = None,
                   layout: str = "zigzag", stats: RingStats | None = None) -> Tensor:
    """Causal attention softmax(q k^T / sqrt(D)) v over the whole sequence, of which this rank holds the
    tokens that `layouts.shard` gives it (q, k, v of shape (..., S_local, D)); Liu et al. 2023.

    group: the context-parallel group (None: the whole world; a single process is a group of one).
    layout: "zigzag" (balanced) or "contiguous". stats: a `RingStats` to record work and bytes into."""
    check_layout(layout)
    if not (q.shape == k.shape == v.shape) or q.dim() < 2:
        raise ValueError(f"q, k and v must have one shape (..., S_local, D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)} and {tuple(v.shape)}; split heads before calling")
    p = group_size(group)
    check_seq_len(p * q.shape[-2], p, layout)
    return RingAttention.apply(q, k, v, group, layout, stats)
