"""The bytes chapter 6's folded MoE block (`distlab.moe.folded_block.FoldedMoEBlock`) saves for backward on
one rank, tensor by tensor, under the routing it actually did.

`moe_activations` prices a frontier MoE layer in general (balanced routing, SwiGLU experts, FlashAttention);
this prices the course's block exactly, so that the estimate can be held to a measured step
(tests/memory/estimate/test_moe_block_activations.py). Each saved storage counts once (as
`accounting.saved_activation_bytes` counts it). With T = B S tokens of the rank's data-parallel replica,
t of them its tensor-parallel slice (`token_slices`), e bytes per value, tp, E experts, k choices:

- **attention** (chapter 5's block, its heads split over tp): the first LayerNorm's input T h, its mean and
  reciprocal deviation T each, its output T h (the query-key-value projection's input), the projection's
  output 3 T h / tp (q, k and v are views of it, saved by the attention kernel), the attention output
  T h / tp (the output projection's input) and the kernel's log-sum-exp B a / tp S in fp32;
- **the second LayerNorm**: its input and output T h, mean and deviation; the output is the router's input
  whole (each tp rank's slice is a view of it), so it is not divided by tp;
- **router** on t tokens: the logits t E (kept by the z-loss's log-sum-exp) and its result t, the softmax's
  probabilities t E, the top-k indices t k (int64), the kept mask t k (bool); for k > 1 the chosen
  probabilities t k and their sum t (the renormalisation), and the load-balancing loss's fractions E;
- **dispatch and combine** on the n rows the rank sends (its kept assignments; t k when nothing is
  dropped): the row indices n and the choice indices n (int64), and on the way back the returned rows n h
  and their gates n (the combine's product needs both) and the gated rows n h;
- **experts**, for each of the rank's experts j on the r_j rows it received: their indices r_j (int64),
  the input r_j h, the first linear layer's output and the GELU's output r_j F each, and the expert's
  output r_j h (kept by the copy into the combine buffer).

`GENERIC` names the terms any MoE layer saves, which `moe_activations.layer_bytes` counts; the others are
this implementation's (its index tensors, the LayerNorms' statistics, the z-loss's logits, the experts'
outputs kept by `index_copy` and the gated rows kept by `index_add`).

Under uneven routing r_j and n are what the router did: `rank_rows` reads them from the measured
per-expert counts of every rank of the ep group (`Routing.tokens_per_expert()`). The bytes depend on
those counts and on nothing else the data holds. Nothing is recomputed here; `recompute_norms` leaves out
what recomputing the two LayerNorms in backward frees (their outputs and statistics; their inputs are kept,
as the recomputation needs them), the accounting DeepSeek-V3 applies to its RMSNorms (sec. 3.2.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distlab.moe.folded_block import token_slices

INDEX_BYTES, MASK_BYTES, LSE_BYTES = 8, 1, 4  # int64 indices, bool masks, fp32 log-sum-exp


@dataclass(frozen=True)
class BlockShape:
    """The folded block's sizes (`FoldedMoEBlock(d_model, n_head, d_hidden, num_experts, k, ...)`), its
    input (batch, seq) per dp replica and its folding (tp, ep); `e` bytes per value (4 fp32, 2 bf16)."""

    batch: int
    seq: int
    hidden: int
    heads: int
    ffn: int
    experts: int
    top_k: int
    tp: int = 1
    ep: int = 1
    e: int = 4

    def __post_init__(self) -> None:
        for name in ("batch", "seq", "hidden", "heads", "ffn", "experts", "top_k", "tp", "ep", "e"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer, e.g. {name}=2")
        if self.heads % self.tp or self.experts % self.ep:
            raise ValueError(f"tp={self.tp} must divide heads={self.heads} and ep={self.ep} must divide "
                             f"experts={self.experts}; choose tp and ep among their divisors")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def rank_rows(counts: Sequence[Sequence[int]], ep_rank: int) -> tuple[int, list[int]]:
    """(rows sent, rows received per local expert) of rank `ep_rank` of an ep group, from `counts[r][i]`:
    the kept assignments of ep rank r's tokens to global expert i (E per rank, every rank of the group)."""
    experts = len(counts[0])
    if any(len(c) != experts for c in counts) or experts % len(counts) or not 0 <= ep_rank < len(counts):
        raise ValueError(f"counts must hold one row of E counts per ep rank (got {len(counts)} rows), E a "
                         f"multiple of the rows, and ep_rank={ep_rank} one of them")
    per = experts // len(counts)
    mine = range(ep_rank * per, (ep_rank + 1) * per)
    return sum(counts[ep_rank]), [sum(c[i] for c in counts) for i in mine]


def balanced_rows(s: BlockShape, tp_rank: int = 0) -> tuple[int, list[float]]:
    """(rows sent, rows received per local expert) when every expert gets the even share and nothing
    drops: t k sent, t k ep / E per expert, a fraction when E does not divide it (the estimator's
    assumption, `moe_activations.routed_bytes`)."""
    t = token_slices(s.tokens, s.tp)[tp_rank]
    return t * s.top_k, [t * s.top_k * s.ep / s.experts] * (s.experts // s.ep)


def block_terms(s: BlockShape, sent: float, received: Sequence[float], tp_rank: int = 0,
                recompute_norms: bool = False) -> dict[str, float]:
    """Saved bytes of one rank of the folded block, by term (module docstring)."""
    T, h, e, tp = s.tokens, s.hidden, s.e, s.tp
    t = token_slices(T, tp)[tp_rank]
    norm_out = 0 if recompute_norms else T * h * e
    return {
        # what `moe_activations.layer_bytes` counts for any MoE layer (GENERIC)
        "norms": 2 * T * h * e + 2 * norm_out,
        "attention": 4 * T * h * e // tp + s.batch * s.heads // tp * s.seq * LSE_BYTES,
        "router_probs": t * s.experts * e,
        "expert_inputs": sum(received) * h * e,
        "expert_hidden": sum(received) * 2 * s.ffn * e,
        "returned_rows": sent * (h + 1) * e,
        # what this implementation saves besides
        "norm_stats": 0 if recompute_norms else 2 * 2 * T * e,
        "z_loss_logits": t * s.experts * e + t * e,
        "top_k": t * s.top_k * (INDEX_BYTES + MASK_BYTES) + ((t * s.top_k + t) * e if s.top_k > 1 else 0),
        "balance_fractions": s.experts * e,
        "row_indices": sent * 2 * INDEX_BYTES + sum(received) * INDEX_BYTES,
        "expert_outputs": sum(received) * h * e,
        "gated_rows": sent * h * e,
    }


GENERIC = ("norms", "attention", "router_probs", "expert_inputs", "expert_hidden", "returned_rows")


def block_saved_bytes(s: BlockShape, sent: float, received: Sequence[float], tp_rank: int = 0,
                      recompute_norms: bool = False) -> float:
    """The total of `block_terms`."""
    return sum(block_terms(s, sent, received, tp_rank, recompute_norms).values())
