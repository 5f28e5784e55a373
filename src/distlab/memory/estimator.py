"""Bytes per GPU of any training configuration: model states and activations, every parallelism counted.

`estimate(MemoryConfig(...))` combines the chapter's closed forms:

- parameters per GPU: a GPT layer's 12 h^2 weights (and biases) split by tensor parallelism tp, the
  layers split over pp pipeline stages, the embedding on the first stage (Narayanan et al. 2021);
- model states per parameter 2 + 2 + K (mixed, K = 12) or 4 + 4 + 8 (fp32), divided by ZeRO's stage over
  the dp ranks (Rajbhandari et al. 2020, sec. 5); with offload the optimizer state lives in host memory
  instead (Ren et al. 2021, "ZeRO-Offload");
- activations per layer from Korthikanti et al. 2022 (Table 2: tp, sequence parallelism, selective or
  full recomputation), context parallelism cp dividing the sequence, and the micro-batches a pipeline
  stage holds at its worst moment: all m for GPipe, p for 1F1B, p + (p - 1)/v stages' worth for the
  interleaved schedule (Narayanan et al. 2021, sec. 2.2; Korthikanti et al. 2022, sec. 4.2.3).

The block's shape may be a modern one (`distlab.memory.shape`): grouped-query attention (`kv_heads`), an
explicit FFN size (`ffn`), a gated (SwiGLU) MLP (`gated`), untied input and output embeddings (`tied=False`)
and no learned position embedding (`positions=False`); and the pipeline may split the layers unevenly
(`layer_split`, the embedding on the first stage and the output layer on the last). Without these options
every result is chapter 7's GPT-3 block, unchanged.

The total leaves out temporary buffers and allocator fragmentation, which section 1 measures.

`fp8=True` (with mixed precision) is FP8 training as `distlab.memory.fp8` does it: the model states stay
2 + 2 + K (the FP8 weight is a cast copy made before each matmul, or gathered in FP8 under ZeRO-3), and the
inputs of the four linear layers of a block are saved for the backward in FP8, 1 byte each instead of 2
(DeepSeek-AI 2024, arXiv:2412.19437, sec. 3.3.3; `Fp8Linear(save_fp8=True)`); `LINEAR_INPUTS` names them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from distlab.memory import cost_model, shape

SCHEDULES = ("1f1b", "gpipe", "interleaved")
LINEAR_INPUTS = ("qkv input", "projection input", "mlp input", "mlp output-layer input")  # saved in FP8


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

    @property
    def modern(self) -> bool:
        """Whether any shape option of `distlab.memory.shape` departs from chapter 7's GPT-3 block."""
        return (self.kv_heads not in (None, self.heads) or self.ffn not in (None, 4 * (self.hidden or 0))
                or self.gated or not self.tied or not self.positions or self.layer_split is not None
                or self.rounds is not None)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU, by kind; `host_bytes` is what offload puts in the host's memory, per GPU."""

    n_params: float
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    model_states_bytes: float
    activations_bytes: float
    total_bytes: float
    host_bytes: float
    layers_per_stage: float
    in_flight_layers: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


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


def validate(c: MemoryConfig) -> bool:
    """Check a configuration; returns whether it has a shape. Every error names the value and the fix."""
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
    if c.fp8 and c.precision != "mixed":
        raise ValueError(f"fp8=True needs precision='mixed' (bf16 weights and gradients, an fp32 master "
                         f"copy) but precision={c.precision!r}; set precision='mixed' or fp8=False")
    if c.schedule not in SCHEDULES:
        raise ValueError(f"schedule={c.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
    if c.schedule == "interleaved" and (c.interleave < 2 or (c.microbatches or c.pp) % c.pp):
        raise ValueError(
            f"the interleaved schedule needs interleave >= 2 (got {c.interleave}) and a number of "
            f"micro-batches that pp={c.pp} divides (got {c.microbatches or c.pp})"
        )
    if c.schedule != "interleaved" and c.interleave != 1:
        raise ValueError(f"interleave={c.interleave} needs schedule='interleaved'; or set interleave=1")
    if not _has_shape(c):
        return False
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
    return True


def _check_shape_options(c: MemoryConfig) -> None:
    kv = c.kv_heads
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or c.heads % kv):
        raise ValueError(f"kv_heads={kv!r} must be a positive integer that divides heads={c.heads}; or leave "
                         "it out (kv_heads = heads, multi-head attention)")
    if c.ffn is not None and (isinstance(c.ffn, bool) or not isinstance(c.ffn, int) or c.ffn < 1):
        raise ValueError(f"ffn={c.ffn!r} must be a positive integer (the MLP's hidden size), or None for 4 h")
    if c.layer_split is not None:
        shape.stage_layers(c.layers, c.pp, c.layer_split)
    if c.rounds is not None and (isinstance(c.rounds, bool) or not isinstance(c.rounds, int)
                                 or not 1 <= c.rounds <= c.pp):
        raise ValueError(f"rounds={c.rounds!r} must be a whole number from 1 to pp={c.pp} (the micro-batches "
                         "of each round of the interleaved schedule), or None for pp")


def _stage_params(c: MemoryConfig) -> float:
    """Parameters one GPU holds on the pipeline stage that holds the most (modern shapes, uneven splits)."""
    h, t = c.hidden, c.tp
    f = c.ffn or 4 * h
    hkv = shape.kv_width(h, c.heads, c.kv_heads)
    biases = (h + 2 * hkv + f * (2 if c.gated else 1)) / t + 6 * h  # split column biases; norms, row biases
    per_layer = shape.block_weights(h, c.heads, c.kv_heads, c.ffn, c.gated) / t + biases
    split = shape.stage_layers(c.layers, c.pp, c.layer_split)
    embed = c.vocab * h / t + (c.seq * h if c.positions else 0)
    head = (c.vocab * h / t if (not c.tied or c.pp > 1) else 0) + 2 * h
    if c.pp == 1:
        return split[0] * per_layer + embed + head
    return max(split[0] * per_layer + embed, split[-1] * per_layer + head, max(split) * per_layer)


def total_params(c: MemoryConfig) -> float:
    """The model's parameter count from its shape (`c.params` when given)."""
    if c.params is not None:
        return c.params
    if not c.modern:
        return cost_model.gpt_num_params(c.layers, c.hidden, c.vocab, c.seq)
    h, f = c.hidden, c.ffn or 4 * c.hidden
    biases = 7 * h + 2 * shape.kv_width(h, c.heads, c.kv_heads) + f * (2 if c.gated else 1)
    per_layer = shape.block_weights(h, c.heads, c.kv_heads, c.ffn, c.gated) + biases
    return (c.layers * per_layer + c.vocab * h * (1 if c.tied else 2) + (c.seq * h if c.positions else 0)
            + 2 * h)


def params_per_gpu(c: MemoryConfig) -> float:
    """Parameters one GPU holds on the pipeline's first stage (the one with the embedding)."""
    if c.layers is None:
        return c.params / (c.tp * c.pp)
    if c.modern:
        stage = _stage_params(c)
        return stage * c.params / total_params(replace(c, params=None)) if c.params is not None else stage
    h, t = c.hidden, c.tp
    per_layer = 12 * h * h / t + 7 * h / t + 6 * h  # column-parallel biases split; LayerNorms, row biases not
    stage = c.layers / c.pp * per_layer + c.vocab * h / t + c.seq * h + (2 * h if c.pp == 1 else 0)
    if c.params is not None:  # the caller's count, split in the same proportions
        total = c.layers * (12 * h * h + 13 * h) + c.vocab * h + c.seq * h + 2 * h
        return stage * c.params / total
    return stage


def in_flight_layers(c: MemoryConfig) -> float:
    """Layer-micro-batches of activations the first pipeline stage holds at its peak."""
    layers_per_stage = c.layers / c.pp
    m = c.microbatches or c.pp
    if c.pp == 1:
        return c.layers  # one micro-batch at a time (gradient accumulation frees each before the next)
    if c.schedule == "gpipe":
        return m * layers_per_stage
    if c.schedule == "1f1b":
        return min(m, c.pp) * layers_per_stage
    v = c.interleave  # chunks of layers_per_stage / v layers; p v + p - 1 chunks in flight
    return (c.pp * v + c.pp - 1) * layers_per_stage / v


def fp8_saving(c: MemoryConfig, terms: dict[str, tuple[float, bool]]) -> float:
    """Bytes per GPU and layer that FP8 saves when the linear layers' inputs among `terms` (16-bit) are kept
    in 1 byte: half of each, split by tp as its term is; nothing under full recomputation."""
    if not c.fp8 or c.recompute == "full":
        return 0.0
    return sum(n / 2 / (c.tp if split or c.sequence_parallel else 1)
               for k, (n, split) in terms.items() if k in LINEAR_INPUTS)


def modern_layer_bytes(c: MemoryConfig) -> float:
    """One block's saved bytes per GPU for a modern shape (`shape.swap_block_terms`), split by tp as
    Korthikanti et al. 2022, Table 2 splits them; selective recomputation drops the attention core, full
    keeps only the block's input."""
    e, s = (2 if c.precision == "mixed" else 4), c.seq // c.cp
    split_all = c.tp if c.sequence_parallel else 1
    if c.recompute == "full":
        return s * c.micro_batch * c.hidden * e / split_all
    terms = cost_model.layer_activation_terms(s, c.micro_batch, c.hidden, c.heads, e, c.attention, c.dropout)
    terms = shape.swap_block_terms(terms, s, c.micro_batch, c.hidden, c.heads, c.kv_heads, c.ffn, c.gated, e)
    dropped = cost_model.core_terms(c.attention) if c.recompute == "selective" else ()
    return sum(n / (c.tp if split or c.sequence_parallel else 1)
               for k, (n, split) in terms.items() if k not in dropped) - fp8_saving(c, terms)


def stage_activations(c: MemoryConfig) -> list[tuple[float, float]]:
    """Per pipeline stage: (layer-micro-batches in flight, saved bytes per GPU), the head on the last."""
    e, s = (2 if c.precision == "mixed" else 4), c.seq // c.cp
    layer = modern_layer_bytes(c)
    head = cost_model.head_bytes(s, c.micro_batch, c.hidden, c.vocab, e, c.tp)
    split = shape.stage_layers(c.layers, c.pp, c.layer_split)
    m = c.microbatches or c.pp
    out = []
    for i, n in enumerate(split):
        held = shape.in_flight(c.schedule, i, c.pp, m, c.interleave, c.rounds) * n
        out.append((held, held * layer + (head if i == c.pp - 1 else 0)))
    return out


def activation_bytes(c: MemoryConfig) -> float:
    """The first (or, if larger, the last) pipeline stage's saved activations, per GPU; for a modern shape
    or an uneven split, the largest of every stage's (`stage_activations`)."""
    if c.modern:
        return max(b for _, b in stage_activations(c))
    e = 2 if c.precision == "mixed" else 4
    s = c.seq // c.cp
    layer = cost_model.layer_bytes(
        s,
        c.micro_batch,
        c.hidden,
        c.heads,
        e,
        c.attention,
        c.dropout,
        False,
        c.tp,
        c.sequence_parallel,
        c.recompute,
    )
    layer -= fp8_saving(c, cost_model.layer_activation_terms(s, c.micro_batch, c.hidden, c.heads, e))
    head = cost_model.head_bytes(s, c.micro_batch, c.hidden, c.vocab, e, c.tp)
    first = in_flight_layers(c) * layer + (head if c.pp == 1 else 0)
    last = c.layers / c.pp * layer + head
    return max(first, last)


def estimate(c: MemoryConfig) -> MemoryEstimate:
    """Bytes per GPU of configuration `c` (see the module's docstring for each term)."""
    has_shape = validate(c)
    n = params_per_gpu(c)
    p, g, o = cost_model.model_state_bytes(n, c.precision, c.zero, c.dp)
    host = o if c.offload else 0.0
    if c.offload:
        o = 0.0
        if c.host_memory_gb is not None and host * c.gpus_per_node > c.host_memory_gb * 1e9:
            raise ValueError(
                f"offload needs {host * c.gpus_per_node / 1e9:.1f} GB of host memory per node "
                f"({c.gpus_per_node} GPUs x {host / 1e9:.1f} GB of optimizer state) but "
                f"host_memory_gb={c.host_memory_gb}; shard it with zero >= 1 over more dp ranks, "
                "or turn offload off"
            )
    act = activation_bytes(c) if has_shape else 0.0
    flight = in_flight_layers(c) if has_shape else 0.0
    if has_shape and c.modern:
        flight = max(stage_activations(c), key=lambda sb: sb[1])[0]
    return MemoryEstimate(
        total_params(c),
        p,
        g,
        o,
        p + g + o,
        act,
        p + g + o + act,
        host,
        c.layers / c.pp if has_shape else 0.0,
        flight,
    )
