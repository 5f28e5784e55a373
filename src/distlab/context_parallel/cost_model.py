"""Closed-form predictions for ring attention: work per rank, bytes per rank, saved memory per rank.

Notation: p ranks in the context-parallel group, sequence length L, batch b, a heads of width d
(hidden h = a d), e bytes per element. A *block* is one (query chunk, key chunk) pair; the chunks are
L/p long (contiguous) or L/2p long (zig-zag), see `layouts`.

Work (blocks computed in the forward pass, fully masked blocks skipped):
- contiguous: rank r computes r + 1 blocks of (L/p)^2 scores (r full, one diagonal): rank p-1 does p
  times the work of rank 0, and the step takes as long as the busiest rank.
- zig-zag: every rank computes 2p + 1 blocks of (L/2p)^2 scores, (2p + 1) L^2 / 4p^2 in all.

Bytes sent per rank (Liu et al. 2023, sec. 3): one local K/V block is 2 b a (L/p) d e bytes.
- forward: p - 1 steps pass K and V: 2 (p-1) b a (L/p) d e;
- backward: K and V again, plus the dK, dV accumulators: 4 (p-1) b a (L/p) d e.
Each rank sends as much as it receives, the same on every rank and for both layouts.

Saved activations of the attention core per rank: q, k, v and the output, b a (L/p) d e each, and one
log-sum-exp per query row and head, b a (L/p) numbers: linear in L/p, no L x L matrix
(chapter 7's estimator with attention="flash" and cp = p counts the same terms).
"""

from __future__ import annotations

from distlab.context_parallel.layouts import block_kind, check_layout, chunk_ids, num_chunks
from distlab.memory.estimate import cost_model as memory_cost_model


def blocks_per_rank(p: int, layout: str) -> list[int]:
    """Forward blocks each rank computes (full + diagonal): r + 1 (contiguous) or 2p + 1 (zig-zag)."""
    if check_layout(layout) == "contiguous":
        return [r + 1 for r in range(p)]
    return [2 * p + 1] * p


def skipped_per_rank(p: int, layout: str) -> list[int]:
    """Fully masked blocks each rank skips: p - 1 - r (contiguous) or 2p - 1 (zig-zag)."""
    pairs = num_chunks(p, layout) * len(chunk_ids(0, p, layout))
    return [pairs - n for n in blocks_per_rank(p, layout)]


def score_entries_per_rank(p: int, seq_len: int, layout: str) -> list[float]:
    """Entries of Q K^T each rank computes per batch element and head: blocks x chunk length squared."""
    c = seq_len / num_chunks(p, layout)
    return [n * c * c for n in blocks_per_rank(p, layout)]


def imbalance(p: int, layout: str) -> float:
    """Busiest rank's work over the mean: 2p / (p + 1) for contiguous, 1 for zig-zag."""
    work = blocks_per_rank(p, layout)
    return max(work) * len(work) / sum(work)


def kv_block_bytes(p: int, seq_len: int, batch: int, heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of one rank's K and V together: 2 b a (L/p) d e."""
    return 2 * batch * heads * (seq_len // p) * head_dim * dtype_bytes


def bytes_per_rank(p: int, seq_len: int, batch: int, heads: int, head_dim: int,
                   dtype_bytes: int) -> dict[str, int]:
    """Bytes each rank sends per step: forward 2 (p-1) b a (L/p) d e, backward twice that."""
    kv = kv_block_bytes(p, seq_len, batch, heads, head_dim, dtype_bytes)
    return {"forward": (p - 1) * kv, "backward": 2 * (p - 1) * kv}


def ring_schedule(p: int, layout: str) -> list[list[tuple[int, int]]]:
    """For each step s and rank r: (the rank whose K/V block r holds, blocks r computes with it)."""
    steps = []
    for s in range(p):
        row = []
        for r in range(p):
            src = (r - s) % p
            n = sum(block_kind(a, b) != "skip" for a in chunk_ids(r, p, layout)
                    for b in chunk_ids(src, p, layout))
            row.append((src, n))
        steps.append(row)
    return steps


def attention_saved_bytes(p: int, seq_len: int, batch: int, heads: int, head_dim: int, dtype_bytes: int,
                          lse_bytes: int | None = None) -> int:
    """What ring attention saves for backward per rank: q, k, v, out (4 b a (L/p) d e) and the
    log-sum-exp (b a (L/p) numbers of `lse_bytes` bytes, by default the same dtype)."""
    s = seq_len // p
    lse = dtype_bytes if lse_bytes is None else lse_bytes
    return 4 * batch * heads * s * head_dim * dtype_bytes + batch * heads * s * lse


def estimator_attention_bytes(cp: int, seq_len: int, batch: int, heads: int, head_dim: int,
                              dtype_bytes: int) -> float:
    """The same tensors as chapter 7's estimator counts them (Korthikanti et al. 2022 terms, with
    attention="flash" and the sequence divided by cp): "q, k, v" + "projection input" + "log-sum-exp"
    (which the estimator always counts as fp32, 4 bytes)."""
    terms = memory_cost_model.layer_activation_terms(seq_len // cp, batch, heads * head_dim, heads,
                                                     dtype_bytes, "flash", dropout=False)
    return sum(terms[k][0] for k in ("q, k, v", "projection input", "log-sum-exp"))


def dense_attention_saved_bytes(seq_len: int, batch: int, heads: int, head_dim: int,
                                dtype_bytes: int) -> int:
    """What `merge.block_attention` saves on the whole, unsplit sequence, for contrast: q, k, v
    (3 b a L d e), the masked scores and the probabilities (2 b a L^2 e), the log-sum-exp (b a L e) and
    the boolean causal mask (L^2 bytes). The L^2 terms are what ring attention never holds."""
    L = seq_len
    return (3 * batch * heads * L * head_dim * dtype_bytes + 2 * batch * heads * L * L * dtype_bytes
            + batch * heads * L * dtype_bytes + L * L)


# ---- DeepSpeed-Ulysses beside the ring, and their hybrid (USP) --------------------------------------
# Jacobs et al. 2023, sec. 3.1: per rank, four all-to-alls in the forward pass (q, k, v to heads; the
# output back) and four in the backward (dout to heads; dq, dk, dv back), each sending (p-1)/p of a
# buffer of L/p tokens. With a query heads and a_kv key/value heads (GQA):
#     Ulysses, forward = backward: (p-1)/p (2a + 2a_kv) b (L/p) d e      (falls as 1/p per rank)
#     ring, forward: (p-1) 2 a_kv b (L/p) d e, backward twice that      (about constant in p)
# The hybrid (Fang & Zhao 2024, USP): cp = u r; all-to-alls over u ranks of L/(u r) tokens, then a
# ring over r ranks of K/V blocks of a_kv/u heads and L/r tokens.


def ulysses_bytes_per_rank(p: int, seq_len: int, batch: int, heads: int, kv_heads: int, head_dim: int,
                           dtype_bytes: int) -> dict[str, float]:
    """Bytes each rank sends per pass in Ulysses' all-to-alls: (p-1)/p (2a + 2a_kv) b (L/p) d e each way."""
    buffers = (2 * heads + 2 * kv_heads) * batch * (seq_len // p) * head_dim * dtype_bytes
    sent = (p - 1) / p * buffers
    return {"forward": sent, "backward": sent}


def hybrid_bytes_per_rank(u: int, r: int, seq_len: int, batch: int, heads: int, kv_heads: int,
                          head_dim: int, dtype_bytes: int) -> dict[str, float]:
    """USP's bytes per rank and pass, split by link: "ulysses" (inside a node, all-to-alls over u ranks of
    L/(u r) tokens) and "ring" (across nodes: K/V of a_kv/u heads and L/r tokens, r - 1 hops)."""
    a2a = ulysses_bytes_per_rank(u, seq_len // r, batch, heads, kv_heads, head_dim, dtype_bytes)["forward"]
    kv = 2 * batch * (kv_heads / u) * (seq_len // r) * head_dim * dtype_bytes
    return {"ulysses": a2a, "ring_forward": (r - 1) * kv, "ring_backward": 2 * (r - 1) * kv}


def attention_flops(seq_len: int, batch: int, heads: int, head_dim: int) -> float:
    """Forward flops of causal attention on the whole sequence: Q K^T and P V, 2 b a L^2 d each, halved
    by the mask (Dao et al. 2022 count 4 b a L^2 d without it)."""
    return 2.0 * batch * heads * seq_len**2 * head_dim


def cp_attention_time(scheme: str, seq_len: int, batch: int, heads: int, kv_heads: int, head_dim: int,
                      dtype_bytes: int, flops_per_s: float, intra_GBps: float,
                      inter_GBps: float | None = None, u: int = 1, r: int = 1, alpha_s: float = 0.0,
                      backward_factor: float = 2.0) -> dict[str, float]:
    """Seconds per rank for one attention layer's forward and backward, in the alpha-beta model.

    scheme "ring" (r ranks; u = 1), "ulysses" (u ranks; r = 1) or "hybrid" (u x r). compute: the flops
    over u r ranks (the backward `backward_factor` times the forward); the ring's K/V hops overlap the
    block compute of their step (only what exceeds it is exposed, Liu et al. 2023); Ulysses' all-to-alls
    wait for nothing to overlap and are exposed in full. intra_GBps: per rank, per direction, inside a
    node (the all-to-all's links); inter_GBps: the ring's links (across nodes; default the same).
    Returns compute, comm (all bytes moved, as time), exposed and total (compute + exposed)."""
    if scheme not in ("ring", "ulysses", "hybrid"):
        raise ValueError(f"scheme={scheme!r} is unknown; choose 'ring', 'ulysses' or 'hybrid'")
    if scheme == "ring":
        u = 1
    if scheme == "ulysses":
        r = 1
    inter = intra_GBps if inter_GBps is None else inter_GBps
    compute = attention_flops(seq_len, batch, heads, head_dim) * (1 + backward_factor) / (u * r) / flops_per_s
    a2a_bytes = ulysses_bytes_per_rank(u, seq_len // r, batch, heads, kv_heads, head_dim, dtype_bytes)
    a2a = (a2a_bytes["forward"] + a2a_bytes["backward"]) / (intra_GBps * 1e9) + 8 * alpha_s * (u - 1)
    ring = 0.0
    exposed_ring = 0.0
    if r > 1:
        kv = hybrid_bytes_per_rank(u, r, seq_len, batch, heads, kv_heads, head_dim, dtype_bytes)
        hop_f = kv["ring_forward"] / (r - 1) / (inter * 1e9) + alpha_s
        hop_b = kv["ring_backward"] / (r - 1) / (inter * 1e9) + 2 * alpha_s
        step_f = compute / (1 + backward_factor) / r  # one of r ring steps of the forward
        step_b = step_f * backward_factor
        ring = (r - 1) * (hop_f + hop_b)
        exposed_ring = (r - 1) * (max(0.0, hop_f - step_f) + max(0.0, hop_b - step_b))
    return {"compute": compute, "comm": a2a + ring, "exposed": a2a + exposed_ring,
            "total": compute + a2a + exposed_ring}
