"""Saved activations per GPU: the bytes one layer keeps for its backward, and how many layers' worth a
pipeline stage holds at its worst moment.

Per layer, Korthikanti et al. 2022 (Table 2) term by term: split by tp where the layer is tensor-parallel,
by tp everywhere under sequence parallelism, the attention core dropped under selective recomputation and
only the block's input kept under full recomputation; context parallelism cp divides the sequence. A
stage holds all m micro-batches under GPipe, p under 1F1B and p + (p - 1)/v stages' worth under the
interleaved schedule (Narayanan et al. 2021, sec. 2.2; Korthikanti et al. 2022, sec. 4.2.3). With FP8 the
inputs of a block's four linear layers (`LINEAR_INPUTS`) are saved in 1 byte instead of 2 (DeepSeek-AI
2024, arXiv:2412.19437, sec. 3.3.3). Modern shapes and uneven splits go stage by stage
(`stage_activations`).
"""

from __future__ import annotations

from distlab.memory.estimate import cost_model, shape
from distlab.memory.estimate.config import MemoryConfig

LINEAR_INPUTS = ("qkv input", "projection input", "mlp input", "mlp output-layer input")  # saved in FP8


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
