"""One training configuration for the memory estimator, and its checks.

`MemoryConfig` holds what the estimator's command line (`python -m distlab.memory estimate`) and the
planner describe: the model (a parameter count, or its shape: layers, hidden, heads, vocab, and the modern
shape options of `distlab.memory.estimate.shape`), the micro-batch and sequence, the parallel layout (dp, tp,
pp, cp; the pipeline's schedule, micro-batches and interleaving), ZeRO's stage, precision, recomputation,
offload, FP8, and the Adam implementation and device (`optimizer_step`). `validate` checks one before
anything is computed, in the order a reader fixes them (the training options, the pipeline schedule, then
the shape against the layout); every error names the value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from distlab.layout import Layout
from distlab.memory.estimate import cost_model, shape
from distlab.memory.estimate.optimizer_step import adam_form
from distlab.model_shape import ModelShape

SCHEDULES = ("1f1b", "gpipe", "interleaved")


@dataclass(frozen=True)
class MemoryConfig:
    """One training configuration. Give `params` for model states alone, or the shape (layers, hidden,
    heads, vocab) for activations too; with both, `params` sets the model-state count."""

    params: float | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    seq: int = 2048
    micro_batch: int = 1
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    zero: int = 0
    precision: str = "mixed"
    recompute: str = "none"
    offload: bool = False
    schedule: str = "1f1b"
    microbatches: int | None = None  # m per pipeline step; defaults to pp
    interleave: int = 1  # v, model chunks per pipeline rank (interleaved schedule)
    sequence_parallel: bool = False
    attention: str = "math"
    dropout: bool = True
    gpus_per_node: int = 8
    host_memory_gb: float | None = None
    kv_heads: int | None = None  # grouped-query attention; None = heads
    ffn: int | None = None  # the MLP's hidden size f; None = 4 hidden
    gated: bool = False  # SwiGLU: three h x f matrices
    tied: bool = True  # the output layer reuses the input embedding
    positions: bool = True  # a learned position embedding of seq x hidden
    layer_split: tuple[int, ...] | None = None  # layers per pipeline stage; None = even (pp must divide)
    rounds: int | None = None  # interleaved schedule: micro-batches per round through the chunks; None = pp
    fp8: bool = False  # FP8 linear layers: their saved inputs in 1 byte (module docstring)
    adam: str = "default"  # Adam's implementation: for-loop, foreach, fused; default: torch's per device
    device: str = "cuda"  # where the step runs: cuda (a GPU) or cpu; it picks the default Adam

    @property
    def model_shape(self) -> ModelShape | None:
        """The shape as the course's one `ModelShape` (biases included, as the estimator counts them);
        None without a shape (`params` alone)."""
        if self.layers is None:
            return None
        return ModelShape(layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=self.vocab,
                          seq=self.seq, kv_heads=self.kv_heads, ffn=self.ffn, gated=self.gated,
                          tied=self.tied, positions=self.positions)

    @classmethod
    def of(cls, shape: ModelShape, layout: Layout | None = None, **rest: object) -> MemoryConfig:
        """The configuration of `shape` on `layout` (dp, tp, pp, cp; None: one GPU), with the training
        options in `rest` (micro_batch, zero, precision, ...)."""
        if not shape.bias:
            raise ValueError("the estimator counts a model with biases; give a ModelShape with bias=True")
        sizes = {} if layout is None else {a: layout.size(a) for a in ("dp", "tp", "pp", "cp")}
        return cls(layers=shape.layers, hidden=shape.hidden, heads=shape.heads, vocab=shape.vocab,  # type: ignore[arg-type]
                   seq=shape.seq, kv_heads=shape.kv_heads, ffn=shape.ffn, gated=shape.gated, tied=shape.tied,
                   positions=shape.positions, **sizes, **rest)

    @property
    def layout(self) -> Layout:
        """The sizes as the course's one `Layout` (dp, tp, pp, cp)."""
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp)

    @property
    def modern(self) -> bool:
        """Whether any shape option of `distlab.memory.estimate.shape` departs from chapter 7's GPT-3
        block."""
        return (self.kv_heads not in (None, self.heads) or self.ffn not in (None, 4 * (self.hidden or 0))
                or self.gated or not self.tied or not self.positions or self.layer_split is not None
                or self.rounds is not None)



def _positive(**values: int | float | None) -> None:
    for name, v in values.items():
        if v is not None and (isinstance(v, bool) or not v > 0):
            raise ValueError(f"{name}={v!r} must be positive")


def _has_shape(c: MemoryConfig) -> bool:
    shape = (c.layers, c.hidden, c.heads, c.vocab)
    if any(x is not None for x in shape) and any(x is None for x in shape):
        raise ValueError(
            "layers, hidden, heads and vocab go together; give all four (for activations) or "
            "none (and params, for model states only)"
        )
    if shape[0] is None and c.params is None:
        raise ValueError("give params (the parameter count) or the model's layers, hidden, heads and vocab")
    return shape[0] is not None



MIN_PARAMS = 1_000  # the smallest model the course trains (2 layers of width 16) has about 7,000
PARAMS_AGREE = 2.0  # --params beside a shape: within this factor of the shape's own count


def validate(c: MemoryConfig) -> bool:
    """Check a configuration; returns whether it has a shape. Every error names the value and the fix."""
    _check_training(c)
    _check_schedule(c)
    _check_params(c)
    if not _has_shape(c):
        return False
    _check_shape(c)
    _check_params_against_shape(c)
    return True


def _check_params(c: MemoryConfig) -> None:
    """A parameter count that no model has (a typo such as 1 or 2.5) is refused, not computed as 0 bytes."""
    if c.params is not None and not isinstance(c.params, bool) and c.params < MIN_PARAMS:
        raise ValueError(f"params={c.params!r} is not a plausible parameter count: a model has at least "
                         f"{MIN_PARAMS:,} (the course's smallest GPT has about 7,000); give the count "
                         "itself, e.g. params=1.3e9, or leave params out and give the shape")


def total_params(c: MemoryConfig) -> float:
    """The model's parameter count from its shape (`c.params` when given): `ModelShape.params`."""
    if c.params is not None:
        return c.params
    if c.model_shape is None:
        raise ValueError("give params (the parameter count) or the model's layers, hidden, heads and vocab")
    return c.model_shape.params


def _check_params_against_shape(c: MemoryConfig) -> None:
    """With a shape, `params` replaces the shape's count for the model states: it must be about the same."""
    if c.params is None:
        return
    own = total_params(replace(c, params=None))
    if not own / PARAMS_AGREE <= c.params <= own * PARAMS_AGREE:
        raise ValueError(f"params={c.params:.4g} disagrees with the shape (layers={c.layers}, "
                         f"hidden={c.hidden}, vocab={c.vocab}, seq={c.seq}), which has {own:.4g} parameters; "
                         f"give params within a factor of {PARAMS_AGREE:g} of it, or leave params out")


def _check_training(c: MemoryConfig) -> None:
    """Sizes that must be positive, ZeRO's stage, the precision, recomputation and FP8."""
    _positive(
        params=c.params,
        layers=c.layers,
        hidden=c.hidden,
        heads=c.heads,
        vocab=c.vocab,
        seq=c.seq,
        micro_batch=c.micro_batch,
        dp=c.dp,
        tp=c.tp,
        pp=c.pp,
        cp=c.cp,
        microbatches=c.microbatches,
        interleave=c.interleave,
        gpus_per_node=c.gpus_per_node,
        host_memory_gb=c.host_memory_gb,
    )
    cost_model.check_zero_stage(c.zero, name="zero")
    cost_model.check_precision(c.precision)
    if c.recompute not in cost_model.RECOMPUTE:
        raise ValueError(
            f"recompute={c.recompute!r} is unknown; choose one of {', '.join(cost_model.RECOMPUTE)}"
        )
    adam_form(c.adam, c.device)
    if c.fp8 and c.precision != "mixed":
        raise ValueError(f"fp8=True needs precision='mixed' (bf16 weights and gradients, an fp32 master "
                         f"copy) but precision={c.precision!r}; set precision='mixed' or fp8=False")


def _check_schedule(c: MemoryConfig) -> None:
    """The pipeline schedule, and the interleaving only the interleaved schedule has."""
    if c.schedule not in SCHEDULES:
        raise ValueError(f"schedule={c.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
    if c.schedule == "interleaved" and (c.interleave < 2 or (c.microbatches or c.pp) % c.pp):
        raise ValueError(
            f"the interleaved schedule needs interleave >= 2 (got {c.interleave}) and a number of "
            f"micro-batches that pp={c.pp} divides (got {c.microbatches or c.pp})"
        )
    if c.schedule != "interleaved" and c.interleave != 1:
        raise ValueError(f"interleave={c.interleave} needs schedule='interleaved'; or set interleave=1")


def _check_shape(c: MemoryConfig) -> None:
    """The model's shape against the layout: heads over hidden and tp, layers over the pipeline, the
    sequence over cp."""
    if c.hidden % c.heads:
        raise ValueError(
            f"hidden={c.hidden} is not divisible by heads={c.heads}; choose heads that divide it"
        )
    if c.heads % c.tp:
        raise ValueError(
            f"heads={c.heads} is not divisible by tensor-parallel size tp={c.tp}; choose a tp that "
            f"divides {c.heads}"
        )
    _check_shape_options(c)
    if c.layer_split is None and c.layers % (c.pp * c.interleave):
        raise ValueError(
            f"layers={c.layers} is not divisible by pp * interleave = {c.pp * c.interleave}; choose "
            "a pipeline size (and interleave) that divides the layers, or give layer_split (an uneven "
            f"split, e.g. {list(shape.stage_layers(c.layers, c.pp))})"
        )
    if c.layer_split is not None and min(shape.stage_layers(c.layers, c.pp, c.layer_split)) < c.interleave:
        raise ValueError(f"layer_split={list(c.layer_split)} gives a stage fewer layers than interleave="
                         f"{c.interleave} chunks; choose a smaller interleave or move layers to that stage")
    if c.seq % c.cp:
        raise ValueError(
            f"seq={c.seq} is not divisible by context-parallel size cp={c.cp}; choose a cp that "
            f"divides {c.seq}"
        )


def _check_shape_options(c: MemoryConfig) -> None:
    """The optional shape fields: kv_heads, ffn, layer_split and rounds."""
    kv = c.kv_heads
    if kv is not None and (not _whole_at_least(kv, 1) or c.heads % kv):
        raise ValueError(f"kv_heads={kv!r} must be a positive integer that divides heads={c.heads}; or leave "
                         "it out (kv_heads = heads, multi-head attention)")
    if c.ffn is not None and not _whole_at_least(c.ffn, 1):
        raise ValueError(f"ffn={c.ffn!r} must be a positive integer (the MLP's hidden size), or None for 4 h")
    if c.layer_split is not None:
        shape.stage_layers(c.layers, c.pp, c.layer_split)
    if c.rounds is not None and not (_whole_at_least(c.rounds, 1) and c.rounds <= c.pp):
        raise ValueError(f"rounds={c.rounds!r} must be a whole number from 1 to pp={c.pp} (the micro-batches "
                         "of each round of the interleaved schedule), or None for pp")


def _whole_at_least(x: object, low: int) -> bool:
    """Whether `x` is an int (not a bool) of at least `low`."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= low
