"""One training step of a GPT block stack as PyTorch runs it, tensor by tensor, on one GPU of any layout.

`peak.predict_peak` and `peak_layout.layout_peak` replay the step on a `timeline.Timeline`; this file is the
inventory they replay: for each phase the tensors every op allocates and when each is freed. A block's
forward saves what autograd keeps for the backward (all of it, all but the attention core under selective
recomputation, only the blocks' inputs under full recomputation; Korthikanti et al. 2022, sec. 5); the
backward runs the blocks in autograd's order, rebuilding a block's working set first where it was
recomputed (Chen et al. 2016, sec. 3). The optimizer's step is `optimizer_step`'s; the parameters' shapes,
the embedding and the head, and the whole step (`forward`, `backward`) are in `gpt_ends`. Every size comes
from the shape and the dtype.

`StepShape` holds the sizes of one GPU's share (Korthikanti et al. 2022, Table 2): n tokens of the
micro-batch's local sequence (s / cp under context parallelism), the tensor-parallel degree t dividing the
attention's and the MLP's inner tensors (q, k, v, the attention output, the MLP's f-wide tensors, the
logits over the vocabulary), and `sp` dividing the residual stream's tensors too under sequence
parallelism. With t = sp = 1, flash attention and no dropout it is the course's `distlab.models.GPT` on
one process, which the CPU measures exactly (`tests/memory/test_memory_peak.py`). The options of a
modern block (`distlab.memory.estimate.shape`): h_kv-wide K and V (grouped-query attention), an f-wide MLP,
gated (gate and up outputs and their product saved, as the estimator counts them); "math"
attention saves the s x s softmax and, with dropout, its one-byte mask and output; dropout after each
block's two projections saves a one-byte mask; FP8 keeps the four linear layers' saved inputs in one
byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.memory.estimate.timeline import Timeline


@dataclass(frozen=True)
class StepShape:
    """The sizes one GPU's tensors in a step are made of (module docstring)."""

    n: int  # tokens in this GPU's share of the micro-batch, b s / cp
    s: int  # the local sequence, s / cp
    h: int
    a: int
    v: int
    e: int  # bytes of an activation (and of a parameter and its gradient)
    bias: bool
    t: int = 1  # tensor-parallel degree
    sp: int = 1  # t under sequence parallelism, else 1
    kv: int | None = None  # h_kv, the width of K and of V; None = h
    f: int | None = None  # the MLP's hidden size; None = 4 h
    gated: bool = False
    math: bool = False  # attention saves the s x s softmax (else flash: a log-sum-exp)
    dropout: bool = False
    fp8: bool = False  # the linear layers' saved inputs in one byte
    tied: bool = True
    positions: bool = True

    @property
    def nh(self) -> float:
        """A residual-stream tensor on this GPU (split by sp)."""
        return self.n * self.h * self.e / self.sp

    @property
    def full(self) -> float:
        """A residual-stream tensor whole on this GPU (a projection's output before its reduce-scatter)."""
        return self.n * self.h * self.e

    def col(self, width: float) -> float:
        """An inner tensor `width` wide, split by the tensor-parallel degree."""
        return self.n * width * self.e / self.t

    @property
    def ffn(self) -> int:
        return self.f or 4 * self.h

    @property
    def kv_width(self) -> int:
        return self.h if self.kv is None else self.kv

    def saved(self, nbytes: float) -> float:
        """A linear layer's saved input: in one byte under FP8."""
        return nbytes * (1 if self.e == 1 else 0.5) if self.fp8 else nbytes

    @property
    def scores(self) -> float:
        """One s x s attention matrix per head on this GPU (math attention)."""
        return self.a * self.n * self.s * self.e / self.t


# ------------------------------------------------------------------------------------- the forward pass


def _layernorm(tl: Timeline, name: str, sh: StepShape, kind: str) -> None:
    """LayerNorm's output and its mean and reciprocal standard deviation (one number per token each)."""
    tl.alloc(f"{name}.out", sh.saved(sh.nh), kind)
    tl.alloc(f"{name}.mean", sh.n * sh.e / sh.sp, kind)
    tl.alloc(f"{name}.rstd", sh.n * sh.e / sh.sp, kind)


def _attention_forward(tl: Timeline, p: str, sh: StepShape, option: str, kind: str) -> None:
    """The attention core: flash saves its output and an fp32 log-sum-exp per query and head; math saves
    the softmax (and with dropout its mask and output). Selective recomputation keeps neither."""
    if sh.math:
        tl.alloc(p + "scores", sh.scores)
        tl.alloc(p + "softmax", sh.scores, kind)
        tl.free(p + "scores")
        if sh.dropout:
            tl.alloc(p + "attn_mask", sh.scores / sh.e, kind)
            tl.alloc(p + "attn_drop", sh.scores, kind)
        tl.alloc(p + "attn", sh.saved(sh.col(sh.h)), kind)
        if option != "none":
            tl.free(p + "softmax", p + "attn_mask", p + "attn_drop")
        return
    tl.alloc(p + "attn", sh.saved(sh.col(sh.h)), kind)
    tl.alloc(p + "lse", sh.a * sh.n * 4 / sh.t, kind)  # fp32 log-sum-exp per query and head
    if option != "none":
        tl.free(p + "lse")


def _residual(tl: Timeline, p: str, out: str, sh: StepShape, kind: str) -> None:
    """After a projection's output `proj` (whole, then reduce-scattered under sp): its dropout and the
    residual add, which leaves `out`; `proj` is freed."""
    if sh.dropout:
        tl.alloc(p + out + ".mask", sh.nh / sh.e, kind)
    tl.alloc(p + out, sh.nh, kind)
    tl.free(p + "proj")


def _mlp_forward(tl: Timeline, p: str, sh: StepShape, kind: str) -> None:
    """The MLP's f-wide tensors: GELU's input and output, or the gate and up outputs and their product."""
    if sh.gated:
        tl.alloc(p + "gate", sh.col(sh.ffn), kind)
        tl.alloc(p + "fc", sh.col(sh.ffn), kind)  # the up projection
        tl.alloc(p + "silu", sh.col(sh.ffn))
        tl.alloc(p + "gelu", sh.saved(sh.col(sh.ffn)), kind)  # the product, the down projection's input
        tl.free(p + "silu")
    else:
        tl.alloc(p + "fc", sh.col(sh.ffn), kind)
        tl.alloc(p + "gelu", sh.saved(sh.col(sh.ffn)), kind)


def block_forward(tl: Timeline, i: int, sh: StepShape, option: str, kind: str = "activations") -> None:
    """Block i's forward as `recompute.block_forward` runs it; x{i} is alive, x{i+1} is left alive.

    `option` "none" keeps every saved tensor; "core" (selective) drops the attention core; "block" (full)
    keeps nothing but the input, so every tensor is freed after its last use in forward. `kind` is what the
    kept tensors count as ("recomputed" when backward rebuilds them).
    """
    keep = option != "block"
    p = f"L{i}."
    tl.where = f"layer {i} forward"
    _layernorm(tl, p + "ln1", sh, kind)
    if not keep:
        tl.free(p + "ln1.mean", p + "ln1.rstd")
    tl.alloc(p + "qkv", sh.col(sh.h + 2 * sh.kv_width), kind)
    _attention_forward(tl, p, sh, option, kind)
    tl.alloc(p + "proj", sh.full)
    if not keep:
        tl.free(p + "ln1.out", p + "qkv", p + "attn", p + "lse", p + "softmax", p + "attn_mask",
                p + "attn_drop")
    _residual(tl, p, "x1", sh, kind)
    _layernorm(tl, p + "ln2", sh, kind)
    if not keep:
        tl.free(p + "ln2.mean", p + "ln2.rstd")
    _mlp_forward(tl, p, sh, kind)
    if not keep:
        tl.free(p + "fc", p + "gate")
    tl.alloc(p + "mlp_proj", sh.full)
    if not keep:
        tl.free(p + "gelu", p + "ln2.out")
    if sh.dropout:
        tl.alloc(p + "x2.mask", sh.nh / sh.e, kind if keep else "activations")
    tl.alloc(f"x{i + 1}", sh.nh, "activations")  # the next block's (or the final LayerNorm's) input
    tl.free(p + "mlp_proj")
    if not keep:
        tl.free(p + "x1", p + "x1.mask", p + "x2.mask")


def recompute_block(tl: Timeline, i: int, sh: StepShape) -> None:
    """Full recomputation rebuilds block i's saved tensors before its backward. PyTorch's non-reentrant
    checkpoint stops once it has every tensor backward needs, so the last matmul and the residual add
    are not run again."""
    p, kind = f"L{i}.", "recomputed"
    tl.where = f"layer {i} recomputation"
    _layernorm(tl, p + "ln1", sh, kind)
    tl.alloc(p + "qkv", sh.col(sh.h + 2 * sh.kv_width), kind)
    _attention_forward(tl, p, sh, "none", kind)
    tl.alloc(p + "proj", sh.full)
    _residual(tl, p, "x1", sh, kind)
    _layernorm(tl, p + "ln2", sh, kind)
    _mlp_forward(tl, p, sh, kind)
    if sh.dropout:
        tl.alloc(p + "x2.mask", sh.nh / sh.e, kind)


# ------------------------------------------------------------------------------------ the backward pass


def _linear_backward(tl: Timeline, name: str, grad_in: float, weight: float, out: float, sh: StepShape,
                     grads: str) -> None:
    """A linear layer's backward: the input's gradient (a temporary), the weight's and the bias's."""
    tl.alloc(f"d.{name}.in", grad_in)
    tl.alloc(f"g.{name}.weight", weight * sh.e, grads)
    if sh.bias:
        tl.alloc(f"g.{name}.bias", out * sh.e, grads)


def _layernorm_backward(tl: Timeline, name: str, sh: StepShape, grad_out: str, saved_input: str,
                        grads: str) -> None:
    tl.alloc(f"d.{name}.in", sh.nh)
    tl.alloc(f"g.{name}.weight", sh.h * sh.e, grads)
    if sh.bias:
        tl.alloc(f"g.{name}.bias", sh.h * sh.e, grads)
    tl.free(grad_out, saved_input, f"{name}.mean", f"{name}.rstd")


def _mlp_backward(tl: Timeline, p: str, sh: StepShape, grads: str) -> None:
    """From the down projection's input gradient to the MLP input's gradient."""
    h, f, t = sh.h, sh.ffn, sh.t
    _linear_backward(tl, p + "mlp.c_proj", sh.col(f), h * f / t, h, sh, grads)
    tl.free(p + "gelu")
    if sh.gated:
        tl.alloc(p + "d.gate", sh.col(f))
        tl.alloc(p + "d.fc", sh.col(f))
        tl.free(f"d.{p}mlp.c_proj.in", p + "fc", p + "gate")
        _linear_backward(tl, p + "mlp.gate", sh.full, h * f / t, f / t, sh, grads)
        tl.free(p + "d.gate")
    else:
        tl.alloc(p + "d.fc", sh.col(f))  # GELU's backward
        tl.free(f"d.{p}mlp.c_proj.in", p + "fc")
    _linear_backward(tl, p + "mlp.c_fc", sh.full, h * f / t, f / t, sh, grads)
    tl.free(p + "d.fc", p + "ln2.out", f"d.{p}mlp.gate.in")


def _attention_backward(tl: Timeline, p: str, sh: StepShape, option: str) -> None:
    """The attention core's backward: recomputed first under selective recomputation; math attention's
    gradients of the s x s matrices; the gradients of q, k and v, concatenated for c_attn."""
    if option == "core":
        _attention_forward(tl, p + "again.", sh, "none", "recomputed")
    if sh.math:
        tl.alloc(p + "d.probs", sh.scores)
        tl.free(p + "attn_drop", p + "again.attn_drop", p + "attn_mask", p + "again.attn_mask")
        tl.alloc(p + "d.scores", sh.scores)
        tl.free(p + "d.probs", p + "softmax", p + "again.softmax")
    qkv = sh.col(sh.h + 2 * sh.kv_width)
    tl.alloc(p + "d.q", sh.col(sh.h))
    tl.alloc(p + "d.kv", qkv - sh.col(sh.h))
    tl.free(f"d.{p}attn.c_proj.in", p + "qkv", p + "lse", p + "attn", p + "again.attn", p + "again.lse",
            p + "d.scores")
    tl.alloc(p + "d.qkv", qkv)
    tl.free(p + "d.q", p + "d.kv")


def block_backward(tl: Timeline, i: int, sh: StepShape, option: str, grads: str = "grads") -> None:
    """Block i's backward, in autograd's order; d.x{i+1} (the residual stream's gradient) comes in,
    d.x{i} goes out. Each saved tensor is freed once the last op that needs it has run. The parameters'
    gradients count as `grads` ("temporaries" when they are added into accumulated or sharded ones)."""
    p, h, t = f"L{i}.", sh.h, sh.t
    if option == "block":
        recompute_block(tl, i, sh)
    tl.where = f"layer {i} backward (MLP)"
    tl.free(p + "x2.mask")
    _mlp_backward(tl, p, sh, grads)
    _layernorm_backward(tl, p + "ln2", sh, f"d.{p}mlp.c_fc.in", p + "x1", grads)
    tl.alloc(f"d.{p}x1", sh.nh)  # the residual add: the two gradients of x1 summed
    tl.free(f"d.x{i + 1}", f"d.{p}ln2.in", p + "x1.mask")
    tl.where = f"layer {i} backward (attention)"
    _linear_backward(tl, p + "attn.c_proj", sh.col(h), h * h / t, h, sh, grads)
    _attention_backward(tl, p, sh, option)
    qkv = h + 2 * sh.kv_width
    _linear_backward(tl, p + "attn.c_attn", sh.full, qkv * h / t, qkv / t, sh, grads)
    tl.free(p + "d.qkv", p + "ln1.out")
    _layernorm_backward(tl, p + "ln1", sh, f"d.{p}attn.c_attn.in", f"x{i}", grads)
    tl.alloc(f"d.x{i}", sh.nh)
    tl.free(f"d.{p}x1", f"d.{p}ln1.in")
    if grads != "grads":
        tl.free(*[k for k in tl.alive if k.startswith(f"g.{p}")])
