"""The kernels of one training step, each priced where it runs: what one GPU's share of a micro-batch's
forward and backward costs, part by part, and the optimizer step.

- **gemm**: every block's four matrix multiplies (Q/K/V, the attention output, the MLP's up and down;
  Megatron's split over t GPUs of a tensor-parallel group, Shoeybi et al. 2019) and the output layer's,
  each once forward and twice backward (the input's and the weight's gradient, the same FLOPs), each at the
  efficiency its size reaches on this GPU (`distlab.kernel_rates.GemmCurve`): small products run far below
  peak, large ones near `e_max`.
- **attention**: the s x s products by their kernel. Flash attention (Dao et al. 2022) never writes the
  scores to HBM; its time is the FLOPs it executes (half the full 4 s h per token and layer with a causal
  mask, which the kernel skips; backward twice forward) at the kernel's efficiency. The math path runs the
  two products as GEMMs over the whole s x s and moves the scores through HBM: written, read and written by
  the softmax, read by the product with V, forward (4 passes of 2 bytes), twice as much backward.
- **memory**: the memory-bound kernels, bytes over the achieved HBM bandwidth (a roofline's memory side;
  Williams et al. 2009): per block the two LayerNorms (read and write forward; read x and the gradient,
  write one backward), the two residual additions (read two, write one, both passes), the MLP's activation
  on its f/t columns (GELU: 2 passes forward, 3 backward; SwiGLU's silu and product: 5 and 8), the attention
  output's transpose (2 and 2); the embedding (gather of the token and position rows and their sum, 6 passes
  of T h; backward 2 T h and the dense gradient of the V h table, written and added to the tied output
  layer's, 4 V h / t); the final LayerNorm; and the cross-entropy of the T x V/t logits (log-softmax and
  its gradient: 6 passes). All in bf16, 2 bytes per value.
- **optimizer**: once per step, Adam over this GPU's parameters: reads the parameter, its gradient and
  both moments and writes three of them (7 x 4 bytes); with fp32 master weights (Micikevicius et al. 2018,
  `memory.precision.MasterWeights`) also the bf16 gradient's cast to fp32 (2 + 4) and the copy back into
  the bf16 weights (4 + 2): 40 bytes per parameter. And this course's `MasterWeights.step` checks every
  gradient for an inf or a NaN with `bool(torch.isfinite(g).all())` (`memory.precision.unscale_`): one
  host synchronisation per parameter tensor, each `rates.sync_s` with the GPU idle (`one_gpu_step`).

`micro_batch_parts` gives these seconds for one micro-batch of b sequences of s/c tokens on one GPU;
`one_gpu_step` a whole step of one GPU; `effective_efficiency` the eta that the parts imply for a
candidate, which the planner's terms then use (`cost_model.step_time`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cache

from distlab.kernel_rates import KernelRates, fallback
from distlab.plan.efficiency import MEASURED, BlockTiming
from distlab.plan.inputs import ModelSpec

VALUE_BYTES = 2  # bf16 activations
OPTIMIZER_BYTES = {"mixed": 40, "fp32": 28}  # bytes moved per parameter by one Adam step (docstring)
ATTENTIONS = ("flash", "math")


@dataclass(frozen=True)
class Parts:
    """Seconds of one GPU's share, part by part (module docstring): `gemm` the blocks' products, `head`
    the output layer's, `attention` the s x s core, `memory` the memory-bound kernels, `optimizer` Adam."""

    gemm: float
    head: float
    attention: float
    memory: float
    optimizer: float = 0.0

    @property
    def total(self) -> float:
        return self.gemm + self.head + self.attention + self.memory + self.optimizer

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def block_gemms(model: ModelSpec, tokens: int, tp: int = 1) -> list[tuple[int, int, int]]:
    """The (m, n, k) of one block's forward products on one GPU of a tensor-parallel group of `tp`."""
    h, f = model.hidden, model.ffn or 4 * model.hidden
    q, kv = h, model.model_shape.kv_width
    up = (2 if model.gated else 1) * f
    return [(tokens, (q + 2 * kv) // tp, h), (tokens, h, q // tp), (tokens, up // tp, h),
            (tokens, h, f // tp)]


def attention_seconds(model: ModelSpec, micro_batch: int, rates: KernelRates, tp: int = 1, cp: int = 1,
                      attention: str = "flash") -> float:
    """One block's attention core, forward and backward, for s/c queries against s keys (docstring)."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention={attention!r} is unknown; choose one of {', '.join(ATTENTIONS)}")
    s, h = model.seq, model.hidden
    queries = micro_batch * s // cp
    full = 4.0 * queries * s * h / tp  # forward FLOPs of Q K^T and P V, counted over the whole s x s
    if attention == "flash":
        return 3 * 0.5 * full / (rates.flash_efficiency * rates.peak)
    heads, d = model.heads // tp, h // model.heads
    scores = micro_batch * heads * (s // cp) * s
    per_head = rates.bf16.seconds(s // cp, s, d)  # one head's Q K^T (P V has the same FLOPs)
    return 3 * 2 * micro_batch * heads * per_head + rates.memory_seconds(12 * VALUE_BYTES * scores)


def block_memory_values(model: ModelSpec, tokens: int, tp: int = 1) -> float:
    """Values one block's memory-bound kernels move, forward and backward (module docstring): the norms
    and residual additions over T h (10 passes forward and 12 backward), the MLP's activation over its f/t
    columns, the attention output's transpose over T h/t (2 and 2)."""
    h, f = model.hidden, (model.ffn or 4 * model.hidden) // tp
    act = (5 + 8) if model.gated else (2 + 3)
    return tokens * (10 * h + 12 * h + act * f + 4 * h // tp)


def memory_values(model: ModelSpec, tokens: int, tp: int = 1) -> float:
    """Values moved by one micro-batch's memory-bound kernels: the blocks, the embedding, the final norm
    and the loss (module docstring)."""
    h = model.hidden
    embedding = tokens * (6 + 2) * h + 4 * model.vocab * h / tp
    final_norm_and_loss = tokens * (5 * h + 6 * model.vocab / tp)
    return model.layers * block_memory_values(model, tokens, tp) + embedding + final_norm_and_loss


def micro_batch_parts(model: ModelSpec, micro_batch: int, rates: KernelRates, tp: int = 1, cp: int = 1,
                      attention: str = "flash") -> Parts:
    """Forward and backward of one micro-batch of `micro_batch` sequences on one GPU (module docstring)."""
    if micro_batch < 1 or tp < 1 or cp < 1:
        raise ValueError(f"micro_batch={micro_batch}, tp={tp}, cp={cp}: each must be a positive integer")
    tokens = micro_batch * model.seq // cp
    gemm = 3 * model.layers * sum(rates.bf16.seconds(*g) for g in block_gemms(model, tokens, tp))
    head = 3 * rates.bf16.seconds(tokens, model.vocab / tp, model.hidden)
    att = model.layers * attention_seconds(model, micro_batch, rates, tp, cp, attention)
    mem = rates.memory_seconds(VALUE_BYTES * memory_values(model, tokens, tp))
    return Parts(gemm, head, att, mem)


def optimizer_seconds(params: float, rates: KernelRates, precision: str = "mixed") -> float:
    """One Adam step over `params` parameters: bytes per parameter over the achieved HBM bandwidth."""
    if precision not in OPTIMIZER_BYTES:
        raise ValueError(f"precision={precision!r} is unknown; choose one of {', '.join(OPTIMIZER_BYTES)}")
    return rates.memory_seconds(OPTIMIZER_BYTES[precision] * params)


def parameter_tensors(model: ModelSpec) -> int:
    """The parameter tensors of `distlab.models.GPT` (with biases): per block two LayerNorms and four
    linear layers, a weight and a bias each (12; a gated MLP one more); the token embedding, the position
    embedding, an untied output layer, the final LayerNorm's two."""
    embeddings = 1 + int(model.positions) + int(not model.tied)
    return model.layers * (12 + int(model.gated)) + embeddings + 2


def one_gpu_step(model: ModelSpec, micro_batch: int, rates: KernelRates, precision: str = "mixed",
                 attention: str = "flash", per_tensor_sync: bool = True) -> Parts:
    """A whole step on one GPU: one micro-batch forward and backward, then Adam over every parameter; with
    `precision="mixed"` and `per_tensor_sync`, `MasterWeights`' host synchronisation per parameter tensor."""
    p = micro_batch_parts(model, micro_batch, rates, attention=attention)
    syncs = parameter_tensors(model) if (precision == "mixed" and per_tensor_sync) else 0
    optimizer = optimizer_seconds(model.params, rates, precision) + syncs * rates.sync_s
    return Parts(p.gemm, p.head, p.attention, p.memory, optimizer)


def micro_batch_flops(model: ModelSpec, micro_batch: int, tp: int = 1, cp: int = 1) -> float:
    """The planner's model FLOPs of one micro-batch on one GPU: 3 b (s/c) (L (2 W + 4 s h) + 2 V h) / t
    (`cost_model.model_flops`)."""
    w = model.model_shape.block_weights
    per_token = model.layers * (2 * w + 4 * model.seq * model.hidden) + 2 * model.vocab * model.hidden
    return 3 * micro_batch * model.seq / cp * per_token / tp


def effective_efficiency(model: ModelSpec, micro_batch: int, rates: KernelRates, tp: int = 1, cp: int = 1,
                         attention: str = "flash") -> float:
    """The eta at which FLOPs / (eta P) equals the parts' time of one micro-batch on one GPU."""
    parts = micro_batch_parts(model, micro_batch, rates, tp, cp, attention)
    return micro_batch_flops(model, micro_batch, tp, cp) / (rates.peak * parts.total)


def block_seconds(timing: BlockTiming, rates: KernelRates) -> float:
    """The parts' time of one timed block's share (`efficiency.BlockTiming`): its GEMMs, its attention and
    its per-block memory-bound kernels, forward and backward, with no embedding, loss or optimizer."""
    model = ModelSpec(1, timing.hidden, timing.heads, 1, timing.seq, kv_heads=timing.kv_heads, ffn=timing.ffn,
                      gated=timing.gated)
    tokens, t = timing.micro_batch * timing.seq, timing.tp
    gemm = 3 * sum(rates.bf16.seconds(*g) for g in block_gemms(model, tokens, t))
    return gemm + attention_seconds(model, timing.micro_batch, rates, t) + rates.memory_seconds(
        VALUE_BYTES * block_memory_values(model, tokens, t))


@cache
def fallback_rates(gpu: str) -> KernelRates:
    """`kernel_rates.fallback(gpu)` with the bf16 GEMM curve's f_half fitted (bisection) so that the parts
    reproduce the 22B block this course timed on an H100 (`efficiency.MEASURED`); the Llama 3 block
    (`efficiency.SHAPE_STUDY`) is the check (`tests/plan/test_plan_kernel_time.py`)."""
    base = fallback(gpu)
    block = next(b for b in MEASURED if b.gpu == "H100")
    measured = (block.forward_ms + block.backward_ms) * 1e-3
    h100 = fallback("H100")

    def seconds(f_half: float) -> float:
        return block_seconds(block, replace(h100, bf16=replace(h100.bf16, f_half=f_half)))

    lo, hi = 0.0, 1e12
    if seconds(lo) >= measured:
        hi = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if seconds(mid) < measured else (lo, mid)
    curve = replace(base.bf16, f_half=hi, source=f"e_max from {base.bf16.source}; f_half fitted to the "
                                                  f"H100 block {block.name} ({block.where})")
    return replace(base, bf16=curve)
