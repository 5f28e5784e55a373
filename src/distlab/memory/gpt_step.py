"""One training step of `distlab.models.GPT` as PyTorch runs it on CPU, tensor by tensor.

`peak.predict_peak` replays the step on a `timeline.Timeline`; this file is the inventory it replays: the
shapes of the model's parameters (`gpt_parameter_sizes`), and for each phase the tensors every op
allocates and when each is freed. `forward` saves what autograd keeps for the backward (all of it, all
but the attention kernel's log-sum-exp under selective recomputation, only the blocks' inputs under full
recomputation; Korthikanti et al. 2022, sec. 5); `backward` runs the blocks in autograd's order,
rebuilding a block's working set first where it was recomputed (Chen et al. 2016, sec. 3); `adam_step`
and `master_step` are PyTorch's single-tensor Adam, on the weights or on fp32 master copies of them
(Micikevicius et al. 2018). Every size comes from the shape and the dtype; nothing is fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.memory.timeline import Timeline

# ------------------------------------------------------------------------------------------ the shapes


def gpt_parameter_sizes(layers: int, hidden: int, vocab: int, seq: int, bias: bool = True) -> list[int]:
    """Numbers of elements of `distlab.models.GPT`'s parameter tensors, in `model.parameters()` order
    (the output layer is the tied embedding, so it is not repeated)."""
    h = hidden
    block = [h, h] if bias else [h]  # ln_1
    block += [3 * h * h, 3 * h] if bias else [3 * h * h]
    block += [h * h, h] if bias else [h * h]
    block += [h, h] if bias else [h]  # ln_2
    block += [4 * h * h, 4 * h] if bias else [4 * h * h]
    block += [4 * h * h, h] if bias else [4 * h * h]
    return [vocab * h, seq * h, *block * layers, *([h, h] if bias else [h])]


@dataclass(frozen=True)
class StepShape:
    """The sizes one step's tensors are made of."""

    n: int  # tokens in the micro-batch, b s
    s: int
    h: int
    a: int
    v: int
    e: int  # bytes of an activation (and of a parameter and its gradient)
    bias: bool

    @property
    def nh(self) -> int:
        return self.n * self.h * self.e


# ------------------------------------------------------------------------------------- the forward pass


def _layernorm(tl: Timeline, name: str, sh: StepShape, kind: str) -> None:
    """LayerNorm's output and its mean and reciprocal standard deviation (one number per token each)."""
    tl.alloc(f"{name}.out", sh.nh, kind)
    tl.alloc(f"{name}.mean", sh.n * sh.e, kind)
    tl.alloc(f"{name}.rstd", sh.n * sh.e, kind)


def _block_forward(tl: Timeline, i: int, sh: StepShape, option: str, kind: str = "activations") -> None:
    """Block i's forward as `recompute.block_forward` runs it; x{i} is alive, x{i+1} is left alive.

    `option` "none" keeps every saved tensor; "core" (selective) drops the attention kernel's
    log-sum-exp; "block" (full) keeps nothing but the input, so every tensor is freed after its last use
    in forward. `kind` is what the kept tensors count as ("recomputed" when backward rebuilds them).
    """
    keep = option != "block"
    p, nh = f"L{i}.", sh.nh
    tl.where = f"layer {i} forward"
    _layernorm(tl, p + "ln1", sh, kind)
    if not keep:
        tl.free(p + "ln1.mean", p + "ln1.rstd")
    tl.alloc(p + "qkv", 3 * nh, kind)
    tl.alloc(p + "attn", nh, kind)
    tl.alloc(p + "lse", sh.a * sh.n * 4, kind)  # fp32 log-sum-exp per query and head
    if option != "none":
        tl.free(p + "lse")
    tl.alloc(p + "proj", nh)
    if not keep:
        tl.free(p + "ln1.out", p + "qkv", p + "attn")
    tl.alloc(p + "x1", nh, kind)
    tl.free(p + "proj")
    _layernorm(tl, p + "ln2", sh, kind)
    if not keep:
        tl.free(p + "ln2.mean", p + "ln2.rstd")
    tl.alloc(p + "fc", 4 * nh, kind)
    tl.alloc(p + "gelu", 4 * nh, kind)
    if not keep:
        tl.free(p + "fc")
    tl.alloc(p + "mlp_proj", nh)
    if not keep:
        tl.free(p + "gelu", p + "ln2.out")
    tl.alloc(f"x{i + 1}", nh, "activations")  # the next block's (or the final LayerNorm's) input
    tl.free(p + "mlp_proj")
    if not keep:
        tl.free(p + "x1")


def _recompute_block(tl: Timeline, i: int, sh: StepShape) -> None:
    """Full recomputation rebuilds block i's saved tensors before its backward. PyTorch's non-reentrant
    checkpoint stops once it has every tensor backward needs, so the last matmul and the residual add
    are not run again."""
    p, nh, kind = f"L{i}.", sh.nh, "recomputed"
    tl.where = f"layer {i} recomputation"
    _layernorm(tl, p + "ln1", sh, kind)
    tl.alloc(p + "qkv", 3 * nh, kind)
    tl.alloc(p + "attn", nh, kind)
    tl.alloc(p + "lse", sh.a * sh.n * 4, kind)
    tl.alloc(p + "proj", nh)
    tl.alloc(p + "x1", nh, kind)
    tl.free(p + "proj")
    _layernorm(tl, p + "ln2", sh, kind)
    tl.alloc(p + "fc", 4 * nh, kind)
    tl.alloc(p + "gelu", 4 * nh, kind)


def forward(tl: Timeline, sh: StepShape, plan: list[str]) -> None:
    """The forward pass and the loss, with `plan[i]` the recomputation option of block i."""
    tl.where = "embedding"
    tl.alloc("pos", 8 * sh.s, "activations")  # the position ids, int64
    tl.alloc("tok_emb", sh.nh)
    tl.alloc("pos_emb", sh.s * sh.h * sh.e)
    tl.alloc("x0", sh.nh, "activations")
    tl.free("tok_emb", "pos_emb")
    for i, option in enumerate(plan):
        _block_forward(tl, i, sh, option)
    tl.where = "head forward"
    _layernorm(tl, "lnf", sh, "activations")
    tl.alloc("logits", sh.n * sh.v * sh.e)
    tl.alloc("targets", 8 * sh.n, "activations")  # the batch's targets, int64, saved by the loss
    tl.alloc("log_softmax", sh.n * sh.v * sh.e, "activations")
    tl.alloc("loss", sh.e)
    tl.alloc("total_weight", sh.e, "activations")
    tl.free("logits")


# ------------------------------------------------------------------------------------ the backward pass


def _linear_backward(tl: Timeline, name: str, grad_in: float, weight: int, out: int, sh: StepShape) -> None:
    """A linear layer's backward: the input's gradient (a temporary), the weight's and the bias's."""
    tl.alloc(f"d.{name}.in", grad_in)
    tl.alloc(f"g.{name}.weight", weight * sh.e, "grads")
    if sh.bias:
        tl.alloc(f"g.{name}.bias", out * sh.e, "grads")


def _layernorm_backward(tl: Timeline, name: str, sh: StepShape, grad_out: str, saved_input: str) -> None:
    tl.alloc(f"d.{name}.in", sh.nh)
    tl.alloc(f"g.{name}.weight", sh.h * sh.e, "grads")
    if sh.bias:
        tl.alloc(f"g.{name}.bias", sh.h * sh.e, "grads")
    tl.free(grad_out, saved_input, f"{name}.mean", f"{name}.rstd")


def _block_backward(tl: Timeline, i: int, sh: StepShape, option: str) -> None:
    """Block i's backward, in autograd's order; d.x{i+1} (the residual stream's gradient) comes in,
    d.x{i} goes out. Each saved tensor is freed once the last op that needs it has run."""
    p, nh, h = f"L{i}.", sh.nh, sh.h
    if option == "block":
        _recompute_block(tl, i, sh)
    tl.where = f"layer {i} backward (MLP)"
    _linear_backward(tl, p + "mlp.c_proj", 4 * nh, 4 * h * h, h, sh)
    tl.free(p + "gelu")
    tl.alloc(p + "d.fc", 4 * nh)  # GELU's backward
    tl.free(f"d.{p}mlp.c_proj.in", p + "fc")
    _linear_backward(tl, p + "mlp.c_fc", nh, 4 * h * h, 4 * h, sh)
    tl.free(p + "d.fc", p + "ln2.out")
    _layernorm_backward(tl, p + "ln2", sh, f"d.{p}mlp.c_fc.in", p + "x1")
    tl.alloc(f"d.{p}x1", nh)  # the residual add: the two gradients of x1 summed
    tl.free(f"d.x{i + 1}", f"d.{p}ln2.in")
    tl.where = f"layer {i} backward (attention)"
    _linear_backward(tl, p + "attn.c_proj", nh, h * h, h, sh)
    if option == "core":  # selective recomputation reruns the attention kernel here
        tl.alloc(p + "attn.again", nh, "recomputed")
        tl.alloc(p + "lse", sh.a * sh.n * 4, "recomputed")
    tl.alloc(p + "d.q", nh)
    tl.alloc(p + "d.k", nh)
    tl.alloc(p + "d.v", nh)
    tl.free(f"d.{p}attn.c_proj.in", p + "qkv", p + "lse", p + "attn", p + "attn.again")
    tl.alloc(p + "d.qkv", 3 * nh)  # the three gradients concatenated for c_attn
    tl.free(p + "d.q", p + "d.k", p + "d.v")
    _linear_backward(tl, p + "attn.c_attn", nh, 3 * h * h, 3 * h, sh)
    tl.free(p + "d.qkv", p + "ln1.out")
    _layernorm_backward(tl, p + "ln1", sh, f"d.{p}attn.c_attn.in", f"x{i}")
    tl.alloc(f"d.x{i}", nh)
    tl.free(f"d.{p}x1", f"d.{p}ln1.in")


def backward(tl: Timeline, sh: StepShape, plan: list[str]) -> None:
    """The backward pass, from the loss to the embedding's gradient, in autograd's order."""
    tl.phase, tl.where = "backward", "head backward"
    tl.alloc("d.loss", sh.e)
    tl.alloc("d.nll", sh.n * sh.v * sh.e)
    tl.free("total_weight")
    tl.alloc("d.log_softmax", sh.n * sh.v * sh.e)
    tl.free("d.nll", "log_softmax")
    tl.alloc("g.wte.head", sh.v * sh.h * sh.e)  # held by autograd until the embedding's half arrives
    tl.alloc("d.lnf.out", sh.nh)
    tl.free("d.log_softmax", "lnf.out")
    _layernorm_backward(tl, "lnf", sh, "d.lnf.out", f"x{len(plan)}")
    tl.alloc(f"d.x{len(plan)}", sh.nh)
    tl.free("d.lnf.in")
    for i in reversed(range(len(plan))):
        _block_backward(tl, i, sh, plan[i])
    tl.where = "embedding backward"
    tl.alloc("d.pos_emb.sum", sh.s * sh.h * sh.e)
    tl.alloc("g.wpe", sh.s * sh.h * sh.e, "grads")
    tl.free("d.pos_emb.sum", "pos")
    tl.alloc("g.wte.emb", sh.v * sh.h * sh.e)
    tl.free("d.x0")
    tl.alloc("g.wte", sh.v * sh.h * sh.e, "grads")
    tl.free("g.wte.head", "g.wte.emb", "d.loss", "loss")


# ----------------------------------------------------------------------------------- the optimizer step


def adam_step(tl: Timeline, sizes: list[int], state_bytes: int) -> None:
    """PyTorch's single-tensor Adam (its default on CPU): per parameter, sqrt(v) and the denominator
    sqrt(v)/c + eps; the previous parameter's denominator is freed only once the next one exists."""
    for i, numel in enumerate(sizes):
        tl.where = "Adam step"
        tl.alloc(f"adam.sqrt{i}", numel * state_bytes)
        tl.alloc(f"adam.denom{i}", numel * state_bytes)
        tl.free(f"adam.sqrt{i}", f"adam.denom{i - 1}")
    tl.free(f"adam.denom{len(sizes) - 1}")


def master_step(tl: Timeline, sizes: list[int]) -> None:
    """`precision.MasterWeights.step`: fp32 copies of the 16-bit gradients for the masters, a check for
    inf/NaN (one byte per element, one tensor at a time), Adam on the masters, the copy back in place."""
    tl.where = "fp32 master gradients"
    for i, numel in enumerate(sizes):
        tl.alloc(f"master.grad{i}", 4 * numel)
    tl.where = "unscale (isfinite)"
    tl.alloc("unscale.inv64", 8)  # 1/S in float64, then as float32
    tl.alloc("unscale.inv", 4)
    tl.free("unscale.inv64")
    for numel in sizes:
        tl.alloc("isfinite", numel)
        tl.free("isfinite")
    tl.free("unscale.inv")
    adam_step(tl, sizes, 4)
