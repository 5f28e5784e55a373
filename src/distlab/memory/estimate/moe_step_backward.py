"""The backward of one step of chapter 6's folded MoE block on one rank, tensor by tensor, in autograd's
order (`moe_step_ops` holds the forward and the sizes; `moe_step_peak` replays both).

autograd runs the nodes from the loss back (Paszke et al. 2019): the loss's gradient d y (T h), the
combine's (the z-loss and the load-balancing loss on the way), the reverse combine all-to-all, the experts
from the last to the first, the reverse dispatch all-to-all, the router, `f`'s all-reduce of the tokens'
gradient, ln_2, the residual, the attention and `f` again, ln_1. Each saved tensor of `block_terms` goes
when its node is done; every weight gradient appears at its node and stays (`grads`); `grads` is the kind
of the weight gradients.
"""

from __future__ import annotations

from distlab.memory.estimate.moe_step_ops import Widths, expert_terms
from distlab.memory.estimate.timeline import Timeline


def _grad(tl: Timeline, name: str, nbytes: float) -> None:
    tl.alloc(f"g.{name}", nbytes, "grads")


def losses_backward(tl: Timeline, w: Widths) -> None:
    """d y = w (T h), the slice of it the MoE output gets (the pad's backward), the z-loss and the
    load-balancing loss back to the router's logits and probabilities."""
    tl.where = "loss backward"
    t, e, E = w.t, w.s.e, w.s.experts
    tl.alloc("d.y", w.h(w.s.tokens))
    tl.alloc("d.moe", w.h(t))
    tl.where = "z-loss backward"
    tl.alloc("d.lse", t * e)
    tl.alloc("d.lse.tmp", 3 * t * e)
    tl.free("d.lse.tmp")
    tl.alloc("d.z.sub", w.tE)
    tl.alloc("d.z.exp", w.tE)
    tl.alloc("d.logits.z", w.tE)
    tl.free("d.z.sub", "d.z.exp", "d.lse", "logits", "lse")
    tl.where = "load-balancing loss backward"
    tl.alloc("d.p", E * e)
    tl.free("fractions")
    tl.alloc("d.probs.aux", w.tE)
    tl.free("d.p")


def combine_backward(tl: Timeline, w: Widths) -> None:
    """The gate-weighted sum back to the returned rows and the gates, the reverse combine all-to-all."""
    tl.where = "combine backward"
    n, e = w.rows.sent, w.s.e
    tl.alloc("d.gated", w.h(n))
    tl.free("d.moe", "gated")
    tl.alloc("d.returned", w.h(n))
    tl.alloc("d.gate.prod", w.h(n))
    tl.alloc("d.gate", n * e)
    tl.free("d.gate.prod", "d.gated", "returned", "gate")
    tl.alloc("d.gates.zeros", w.tk)
    tl.alloc("d.gates", w.tk)
    tl.free("d.gates.zeros", "d.gate", "choice")
    tl.where = "combine all-to-all backward"
    tl.alloc("d.processed", w.h(w.R))
    tl.free("d.returned")


def expert_backward(tl: Timeline, w: Widths, j: int, incoming: str, first_seen: bool) -> str:
    """Expert j's backward (its index_copy, two linear layers and GELU, its rows' gather); returns the
    name of the gradient of the processed buffer left for expert j - 1."""
    s, r = w.s, w.rows.received[j]
    x = expert_terms(s, r)
    tl.where = f"expert {j} backward"
    left = f"d.processed{j}"
    if j > 0:
        tl.alloc(left, w.h(w.R))  # index_fill: the rows expert j wrote, zeroed
    tl.alloc("d.eout", x["out"])
    tl.free(incoming, f"e{j}.out")
    tl.alloc("d.act", x["act"])
    _grad(tl, f"e{j}.w_out", s.hidden * s.ffn * s.e)
    _grad(tl, f"e{j}.b_out", s.hidden * s.e)
    tl.free("d.eout", f"e{j}.act")
    tl.alloc("d.pre", x["pre"])
    tl.free("d.act", f"e{j}.pre")
    tl.alloc("d.ein", x["in"])
    _grad(tl, f"e{j}.w_in", s.ffn * s.hidden * s.e)
    _grad(tl, f"e{j}.b_in", s.ffn * s.e)
    tl.free("d.pre", f"e{j}.in")
    tl.alloc("d.recv.zeros", w.h(w.R))
    tl.alloc("d.recv.part", w.h(w.R))
    tl.free("d.recv.zeros", "d.ein", f"e{j}.rows")
    if first_seen:
        tl.free("d.recv.part")
        tl.alloc("d.recv", w.h(w.R))  # the same tensor, under its lasting name
    else:
        tl.alloc("d.recv.sum", w.h(w.R))
        tl.free("d.recv.part", "d.recv")
        tl.free("d.recv.sum")
        tl.alloc("d.recv", w.h(w.R))
    return left


def experts_backward(tl: Timeline, w: Widths) -> None:
    """The experts from the last to the first, then the reverse dispatch all-to-all and the gather."""
    incoming = "d.processed"
    for i, j in enumerate(reversed(range(len(w.rows.received)))):
        incoming = expert_backward(tl, w, j, incoming, i == 0)
    tl.where = "dispatch all-to-all backward"
    n = w.rows.sent
    tl.alloc("d.send", w.h(n))
    tl.free("d.recv")
    tl.alloc("d.tokens.zeros", w.h(w.t))
    tl.alloc("d.tokens.dispatch", w.h(w.t))
    tl.free("d.tokens.zeros", "d.send", "token")


def router_backward(tl: Timeline, w: Widths) -> None:
    """The gates and the top-k back to the softmax, the router's weight gradient, f and ln_2."""
    s, t, k, e = w.s, w.t, w.s.top_k, w.s.e
    tl.where = "router backward"
    tl.free("kept")
    tl.alloc("d.gates.tmp", 4 * w.tk if k > 1 else w.tk)
    tl.free("d.gates.tmp", "d.gates", "top_sum")
    tl.alloc("d.top.zeros", w.tE)
    tl.alloc("d.top", w.tE)
    tl.free("d.top.zeros", "top_probs", "expert_index")
    tl.alloc("d.probs", w.tE)
    tl.free("d.top", "d.probs.aux")
    tl.alloc("d.softmax", w.tE)
    tl.free("d.probs", "probs")
    tl.alloc("d.logits", w.tE)
    tl.free("d.softmax", "d.logits.z")
    _grad(tl, "router", s.experts * s.hidden * e)
    tl.alloc("d.tokens.router", w.h(t))
    tl.free("d.logits", "ln_2.out")
    tl.alloc("d.tokens", w.h(t))
    tl.free("d.tokens.router", "d.tokens.dispatch")
    tl.where = "f (moe.split) backward"
    tl.alloc("d.ln_2.out", w.h(s.tokens))  # the slice's backward, whole
    tl.free("d.tokens")
    tl.alloc("d.ln_2.out.f", w.h(s.tokens))  # f's clone, all-reduced
    tl.free("d.ln_2.out")
    _norm_backward(tl, "ln_2", w, "h")


def _norm_backward(tl: Timeline, name: str, w: Widths, saved_input: str | None) -> None:
    tl.where = f"{name} backward"
    if saved_input is not None:
        tl.alloc(f"d.{name}.in", w.h(w.s.tokens))
    _grad(tl, f"{name}.weight", w.s.hidden * w.s.e)
    _grad(tl, f"{name}.bias", w.s.hidden * w.s.e)
    tl.free(f"d.{name}.out.f", f"{name}.mean", f"{name}.rstd", saved_input or "")


def attention_backward(tl: Timeline, w: Widths) -> None:
    """The residual's gradient, the attention (output projection, the core, qkv), f's all-reduce, ln_1."""
    s, T, e, tp = w.s, w.s.tokens, w.s.e, w.s.tp
    inner = w.h(T) / tp
    tl.where = "residual"
    tl.alloc("d.h", w.h(T))
    tl.free("d.y", "d.ln_2.in")
    tl.where = "attention backward"
    _grad(tl, "attn.c_proj.bias", s.hidden * e)
    _grad(tl, "attn.c_proj.weight", s.hidden * s.hidden // tp * e)
    tl.alloc("d.core", inner)
    tl.free("d.h")
    tl.alloc("d.qkv.parts", 3 * inner)
    tl.free("d.core", "attn.saved")
    tl.alloc("d.qkv", 3 * inner)
    tl.free("d.qkv.parts")
    tl.alloc("d.ln_1.out", w.h(T))
    _grad(tl, "attn.c_attn.weight", 3 * s.hidden // tp * s.hidden * e)
    _grad(tl, "attn.c_attn.bias", 3 * s.hidden // tp * e)
    tl.free("d.qkv", "ln_1.out")
    tl.where = "f (attention) backward"
    tl.alloc("d.ln_1.out.f", w.h(T))
    tl.free("d.ln_1.out")
    _norm_backward(tl, "ln_1", w, None)  # the batch needs no gradient
    tl.free("aux_loss", "z_loss")


def backward(tl: Timeline, w: Widths) -> None:
    """The whole backward, in autograd's order (module docstring)."""
    tl.phase = "backward"
    losses_backward(tl, w)
    combine_backward(tl, w)
    experts_backward(tl, w)
    router_backward(tl, w)
    attention_backward(tl, w)
