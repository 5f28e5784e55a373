"""The two ends of a GPT's step, and the parameters one GPU holds: the embedding before the blocks, the
final LayerNorm, the output layer and the loss after them, tensor by tensor (`gpt_step` holds the blocks);
and the whole step, `forward` and `backward`: these ends around `gpt_step`'s blocks.

As `distlab.models.GPT` computes it: token embedding plus a learned position embedding (`positions`), the
final LayerNorm, logits over the vocabulary (split over it by tensor parallelism, as Megatron-LM's
vocabulary-parallel output layer; Shoeybi et al. 2019, sec. 3), the cross-entropy in the model's dtype,
saving its log-softmax. A tied output layer (`tied`) reuses the token embedding: on one GPU autograd holds
the output layer's half of its gradient until the embedding's half arrives and sums them; under a pipeline
the last stage keeps its own copy (Narayanan et al. 2021), whose gradient is an ordinary one, as an
untied output layer's is.
"""

from __future__ import annotations

from distlab.memory.estimate.gpt_step import (
    StepShape,
    _layernorm,
    _layernorm_backward,
    block_backward,
    block_forward,
)
from distlab.memory.estimate.timeline import Timeline


def block_parameter_sizes(h: int, bias: bool = True, t: int = 1, kv: int | None = None, f: int | None = None,
                          gated: bool = False) -> list[float]:
    """Elements of one block's parameter tensors on one of t tensor-parallel GPUs, in `parameters()` order:
    ln_1, c_attn (q, k, v), c_proj, ln_2, the MLP's input layers (c_fc; and gate), its c_proj. Column-
    parallel layers split their weights and biases, row-parallel ones their weights; LayerNorms whole."""
    qkv, f = h + 2 * (h if kv is None else kv), f or 4 * h

    def linear(w: float, b: float) -> list[float]:
        return [w, b] if bias else [w]

    ln = [h, h] if bias else [h]
    mlp_in = linear(f * h / t, f / t) * (2 if gated else 1)
    return [*ln, *linear(qkv * h / t, qkv / t), *linear(h * h / t, h), *ln, *mlp_in, *linear(h * f / t, h)]


def gpt_parameter_sizes(layers: int, hidden: int, vocab: int, seq: int, bias: bool = True, t: int = 1,
                        kv: int | None = None, f: int | None = None, gated: bool = False, first: bool = True,
                        last: bool = True, tied: bool = True, positions: bool = True) -> list[float]:
    """Elements of the parameter tensors one GPU holds, in `model.parameters()` order: the embeddings on the
    first stage, `layers` blocks, the final LayerNorm and (untied, or on a later stage than the embedding)
    the output layer on the last. With the defaults, `distlab.models.GPT` on one process (the output layer
    is the tied embedding, so it is not repeated)."""
    h = hidden
    out: list[float] = [vocab * h / t] + ([seq * h] if positions else []) if first else []
    out += block_parameter_sizes(h, bias, t, kv, f, gated) * layers
    if last:
        out += [h, h] if bias else [h]
        if not (tied and first):
            out.append(vocab * h / t)
    return out


def embedding_forward(tl: Timeline, sh: StepShape) -> None:
    """Token (and position) embeddings summed into x0, the first block's input."""
    tl.where = "embedding"
    if sh.positions:
        tl.alloc("pos", 8 * sh.s, "activations")  # the position ids, int64
    tl.alloc("tok_emb", sh.full)
    if sh.positions:
        tl.alloc("pos_emb", sh.s * sh.h * sh.e)
    tl.alloc("x0", sh.nh, "activations")
    tl.free("tok_emb", "pos_emb")


def head_forward(tl: Timeline, sh: StepShape) -> None:
    """The final LayerNorm, the logits and the loss; the logits are freed once the log-softmax exists."""
    tl.where = "head forward"
    _layernorm(tl, "lnf", sh, "activations")
    tl.alloc("logits", sh.n * sh.v * sh.e / sh.t)
    tl.alloc("targets", 8 * sh.n, "activations")  # the batch's targets, int64, saved by the loss
    tl.alloc("log_softmax", sh.n * sh.v * sh.e / sh.t, "activations")
    tl.alloc("loss", sh.e)
    tl.alloc("total_weight", sh.e, "activations")
    tl.free("logits")


def head_backward(tl: Timeline, sh: StepShape, last_input: str, tied_here: bool = True,
                  grads: str = "grads") -> None:
    """From the loss to the last block's output gradient. `tied_here`: the output layer is the embedding
    on this GPU, so its gradient is held until the embedding's half arrives."""
    tl.phase, tl.where = "backward", "head backward"
    logits = sh.n * sh.v * sh.e / sh.t
    tl.alloc("d.loss", sh.e)
    tl.alloc("d.nll", logits)
    tl.free("total_weight")
    tl.alloc("d.log_softmax", logits)
    tl.free("d.nll", "log_softmax")
    tl.alloc("g.wte.head", sh.v * sh.h * sh.e / sh.t, "temporaries" if tied_here else grads)
    tl.alloc("d.lnf.out", sh.nh)
    tl.free("d.log_softmax", "lnf.out")
    _layernorm_backward(tl, "lnf", sh, "d.lnf.out", last_input, grads)
    tl.alloc(last_input.replace("x", "d.x", 1), sh.nh)
    tl.free("d.lnf.in")
    if grads != "grads":
        tl.free("g.lnf.weight", "g.lnf.bias", "" if tied_here else "g.wte.head")


def embedding_backward(tl: Timeline, sh: StepShape, tied_here: bool = True, grads: str = "grads") -> None:
    """The embeddings' gradients; a tied output layer's half is summed in."""
    tl.where = "embedding backward"
    if sh.positions:
        tl.alloc("d.pos_emb.sum", sh.s * sh.h * sh.e)
        tl.alloc("g.wpe", sh.s * sh.h * sh.e, grads)
        tl.free("d.pos_emb.sum", "pos")
    wte = sh.v * sh.h * sh.e / sh.t
    if tied_here:
        tl.alloc("g.wte.emb", wte)
        tl.free("d.x0")
        tl.alloc("g.wte", wte, grads)
        tl.free("g.wte.head", "g.wte.emb")
    else:
        tl.alloc("g.wte", wte, grads)
        tl.free("d.x0")
    tl.free("d.loss", "loss")
    if grads != "grads":
        tl.free("g.wpe", "g.wte")


# ---------------------------------------------------------------- the whole step: the ends around the blocks


def forward(tl: Timeline, sh: StepShape, plan: list[str]) -> None:
    """The forward pass and the loss, with `plan[i]` the recomputation option of block i."""
    embedding_forward(tl, sh)
    for i, option in enumerate(plan):
        block_forward(tl, i, sh, option)
    head_forward(tl, sh)


def backward(tl: Timeline, sh: StepShape, plan: list[str]) -> None:
    """The backward pass, from the loss to the embedding's gradient, in autograd's order."""
    head_backward(tl, sh, f"x{len(plan)}")
    for i in reversed(range(len(plan))):
        block_backward(tl, i, sh, plan[i])
    embedding_backward(tl, sh)
