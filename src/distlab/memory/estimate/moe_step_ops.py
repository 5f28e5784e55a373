"""One training step of chapter 6's folded MoE block on one rank, tensor by tensor: the inventory that
`moe_step_peak.predict_moe_step_peak` replays on a `timeline.Timeline`.

The saved tensors are `moe_block_activations.block_terms`, allocated in forward where the block makes them
and freed in backward where autograd has used them; nothing here prices a saved tensor a second way.
Besides them a step holds what neither the model states nor the saved activations count (Chen et al.
2016, sec. 3, call them temporaries): the output and its gradient, the gradients of the residual stream and
of the tokens, the all-to-alls' buffers (`AllToAll` makes a new buffer for the rows that arrive, forward
and backward; Lepikhin et al. 2021), the combine's buffers (`zeros_like(...).index_add`, `index_copy`, out
of place), the clones that chapter 5's `f` and `g` all-reduce, the top-k's priority positions (a one-hot
(k t, E) int64 matrix and its cumulative sum) and each expert's backward working set. autograd visits the
experts in the reverse order of their forward (the last `index_copy` first); an expert's weight gradients
appear as its backward runs, while its saved tensors go.

`RankRows` is what the router did on this rank (the one input that depends on the data, as for the saved
activations). The step's loss is sum(y w) + a aux + b z (`measure.moe_step`); the batch x and the weights w
are the caller's, not the step's, so they are not counted (as `accounting.measure_step` leaves out the
batch). Left out, each under 64 bytes: the loss's own scalars, the 8-byte results of one-hot's range
check, and the mesh's coordinates (int32, 4 bytes a rank) that `reduce_gradients` slices out of the
DeviceMesh, which live on into the optimizer's step (freed when Python collects them).
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.memory.estimate.moe_block_activations import INDEX_BYTES, MASK_BYTES, BlockShape, block_terms
from distlab.memory.estimate.timeline import Timeline
from distlab.moe.folded_block import token_slices


@dataclass(frozen=True)
class RankRows:
    """The rank's routing: its tp rank, the rows it sends (its kept assignments, n) and the rows each of its
    local experts receives (r_j, in expert order)."""

    tp_rank: int
    sent: int
    received: tuple[int, ...]


@dataclass(frozen=True)
class Widths:
    """The bytes of the step's tensors on one rank: a residual-stream tensor (T tokens x h), the rank's
    slice of it (t tokens), the rows sent (n) and received (R), the router's (t, E) and (t, k) tensors."""

    s: BlockShape
    rows: RankRows

    @property
    def t(self) -> int:
        return token_slices(self.s.tokens, self.s.tp)[self.rows.tp_rank]

    @property
    def R(self) -> int:
        return sum(self.rows.received)

    def h(self, tokens: float) -> float:
        """`tokens` rows of h values."""
        return tokens * self.s.hidden * self.s.e

    @property
    def tE(self) -> float:
        return self.t * self.s.experts * self.s.e

    @property
    def tk(self) -> float:
        return self.t * self.s.top_k * self.s.e


def expert_terms(s: BlockShape, r: int) -> dict[str, float]:
    """What one expert on r rows saves: its share of `block_terms` (the expert terms are linear in rows)."""
    terms = block_terms(s, 0, [r])
    return {"rows": terms["row_indices"], "in": terms["expert_inputs"], "pre": terms["expert_hidden"] / 2,
            "act": terms["expert_hidden"] / 2, "out": terms["expert_outputs"]}


def attention_forward(tl: Timeline, w: Widths, terms: dict[str, float]) -> None:
    """ln_1, the tp attention and its g (a clone all-reduced, then the output bias), the residual h."""
    tl.where = "attention"
    T, stat = w.s.tokens, terms["norm_stats"] / 4
    tl.alloc("ln_1.out", w.h(T), "activations")  # its input is the batch, the caller's
    tl.alloc("ln_1.mean", stat, "activations")
    tl.alloc("ln_1.rstd", stat, "activations")
    tl.alloc("attn.saved", terms["attention"], "activations")  # qkv, the core's output, its log-sum-exp
    tl.alloc("attn.proj", w.h(T))
    tl.alloc("attn.g", w.h(T))
    tl.alloc("attn.out", w.h(T))  # + the output bias
    tl.free("attn.proj", "attn.g")
    tl.alloc("h", w.h(T), "activations")  # x + attn, saved by ln_2
    tl.free("attn.out")
    tl.alloc("ln_2.out", w.h(T), "activations")  # the router's input (each rank's slice is a view)
    tl.alloc("ln_2.mean", stat, "activations")
    tl.alloc("ln_2.rstd", stat, "activations")
    tl.alloc("slices", INDEX_BYTES * T)  # token_slices' arange
    tl.free("slices")


def router_forward(tl: Timeline, w: Widths) -> None:
    """The router's logits, softmax and top-k, the priority positions, the kept mask and gates."""
    tl.where = "router"
    t, k, E, e = w.t, w.s.top_k, w.s.experts, w.s.e
    tl.alloc("logits", w.tE, "activations")
    tl.alloc("probs", w.tE, "activations")
    tl.alloc("top_probs", w.tk, "activations" if k > 1 else "temporaries")
    tl.alloc("expert_index", INDEX_BYTES * t * k, "activations")
    if k > 1:
        tl.alloc("top_sum", t * e, "activations")
        tl.alloc("gates_norm", w.tk)
    tl.where = "priority positions"
    tl.alloc("flat", INDEX_BYTES * t * k)
    tl.alloc("one_hot", INDEX_BYTES * t * k * E)
    tl.free("flat")
    tl.alloc("cumsum", INDEX_BYTES * t * k * E)
    tl.alloc("minus_one", INDEX_BYTES * t * k * E)
    tl.free("cumsum")
    tl.alloc("flat2", INDEX_BYTES * t * k)
    tl.alloc("position", INDEX_BYTES * t * k)
    tl.free("minus_one", "flat2", "one_hot")
    tl.alloc("kept", MASK_BYTES * t * k, "activations")
    tl.alloc("gates", w.tk)
    tl.free("gates_norm" if k > 1 else "top_probs")


def dispatch_forward(tl: Timeline, w: Widths) -> None:
    """The kept assignments sorted by expert, the counts, the dispatch all-to-all."""
    tl.where = "dispatch"
    n, E = w.rows.sent, w.s.experts
    tl.alloc("nonzero", 2 * INDEX_BYTES * n)
    tl.alloc("expert0", INDEX_BYTES * n)
    tl.alloc("key.mul", INDEX_BYTES * n)
    tl.alloc("key.pos", INDEX_BYTES * n)
    tl.alloc("key", INDEX_BYTES * n)
    tl.free("key.mul", "key.pos")
    tl.alloc("sort.values", INDEX_BYTES * n)
    tl.alloc("order", INDEX_BYTES * n)
    tl.free("sort.values", "key")
    tl.alloc("token", INDEX_BYTES * n, "activations")
    tl.alloc("choice", INDEX_BYTES * n, "activations")
    tl.alloc("expert", INDEX_BYTES * n)
    tl.free("expert0", "nonzero")
    tl.alloc("send_counts", INDEX_BYTES * E)
    tl.alloc("recv_counts", INDEX_BYTES * E)
    tl.where = "dispatch all-to-all"
    tl.alloc("dispatch.send", w.h(n))  # tokens[token]
    tl.alloc("dispatch.recv", w.h(w.R))
    tl.free("dispatch.send")
    tl.alloc("repeat", INDEX_BYTES * w.s.experts)
    tl.alloc("local_expert", INDEX_BYTES * w.R)
    tl.alloc("local_expert.tmp", INDEX_BYTES * w.R)
    tl.free("local_expert.tmp", "repeat")


def experts_forward(tl: Timeline, w: Widths) -> None:
    """Each local expert on its rows, its output copied into a new `processed` buffer (`index_copy`)."""
    tl.alloc("processed", w.h(w.R))
    previous = "processed"
    for j, r in enumerate(w.rows.received):
        x = expert_terms(w.s, r)
        tl.where = f"expert {j} forward"
        tl.alloc("mask", MASK_BYTES * w.R)
        tl.alloc(f"e{j}.rows", x["rows"], "activations")
        tl.free("mask")
        for part in ("in", "pre", "act", "out"):
            tl.alloc(f"e{j}.{part}", x[part], "activations")
        tl.alloc(f"processed{j}", w.h(w.R))
        tl.free(previous)
        previous = f"processed{j}"


def combine_forward(tl: Timeline, w: Widths) -> None:
    """The combine all-to-all, the gate-weighted sum, the losses, g and the residual: y."""
    tl.where = "combine"
    n, t, E, e, T = w.rows.sent, w.t, w.s.experts, w.s.e, w.s.tokens
    tl.alloc("returned", w.h(n), "activations")
    tl.alloc("gate", n * e, "activations")
    tl.alloc("combine.zeros", w.h(t))
    tl.alloc("gated", w.h(n), "activations")
    tl.alloc("moe.y", w.h(t))
    tl.free("combine.zeros")
    tl.where = "losses"
    tl.alloc("first.count", INDEX_BYTES * E)
    tl.alloc("first.float", E * e)
    tl.free("first.count")
    tl.alloc("fractions", E * e, "activations")
    tl.free("first.float")
    tl.alloc("aux_loss", e)  # the losses' values, kept until backward is over
    tl.alloc("lse", t * e, "activations")
    tl.alloc("lse.squared", t * e)
    tl.free("lse.squared")
    tl.alloc("z_loss", e)
    tl.free("order", "expert", "send_counts", "recv_counts", "dispatch.recv", "local_expert",
            f"processed{len(w.rows.received) - 1}" if w.rows.received else "processed")
    tl.where = "output (g)"
    tl.alloc("moe.pad", w.h(T))
    tl.alloc("moe.g", w.h(T))
    tl.alloc("y", w.h(T))
    tl.free("moe.y", "moe.pad", "moe.g")
    tl.where = "loss"
    tl.alloc("counts.index", INDEX_BYTES * n)  # the measurement reads the counts (tokens_per_expert)
    tl.alloc("counts", INDEX_BYTES * E)
    tl.free("counts.index", "counts")
    tl.alloc("yw", w.h(T))
    tl.free("yw", "y", "gates", "position")


def forward(tl: Timeline, s: BlockShape, rows: RankRows) -> None:
    """The block's forward and the loss (module docstring): at its end exactly `block_terms` is alive,
    but for the batch."""
    tl.phase = "forward"
    w = Widths(s, rows)
    attention_forward(tl, w, block_terms(s, rows.sent, rows.received, rows.tp_rank))
    router_forward(tl, w)
    dispatch_forward(tl, w)
    experts_forward(tl, w)
    combine_forward(tl, w)
