"""The shape of a 3D-parallel run, and every check on it that must happen before a rank communicates.

A `Plan3D` says how the ranks are split: dp data-parallel replicas (with ZeRO stage `zero_stage`), pp
pipeline stages (run by `schedule` on m micro-batches), tp tensor-parallel ranks per layer (with or
without sequence parallelism). Narayanan et al. 2021 (sec. 3) call this PTD-P. `check_plan` validates a
plan against the model, the batch and the world, and raises a ValueError that names the parameter, its
value and the fix; every rank runs it on the same inputs, so every rank raises alike, before any
collective that would otherwise hang.

Uneven pipeline splits: the n_layer blocks are cut into pp runs as evenly as possible, the first
n_layer % pp stages getting one block more (`block_ranges`); each stage needs at least one block.
ZeRO stage 3 is refused: it gathers each layer's parameters before that layer's forward and backward
and frees them after, so with m micro-batches per step it would gather every layer 2m times instead of
twice, and its hooks assume one backward per step. Stage 2 works because `train` hands ZeRO the
gradients once, after the pipeline's flush (`ZeRO(..., hook_gradients=False).take_gradients()`);
DeepSpeed's pipeline engine, which reduces during the backward, accepts stage 1 only (an assertion in
deepspeed/runtime/pipe/engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.layout import Layout
from distlab.models import GPTConfig

SCHEDULES_3D = ("gpipe", "1f1b")
ZERO_STAGES_3D = (0, 1, 2)


@dataclass(frozen=True)
class Plan3D:
    """dp x pp x tp ranks; m micro-batches per step; the pipeline schedule; ZeRO's stage over dp;
    sequence parallelism inside tp (Korthikanti et al. 2022)."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    m: int = 1
    schedule: str = "1f1b"
    zero_stage: int = 0
    sequence_parallel: bool = False

    @property
    def layout(self) -> Layout:
        """The sizes as the course's one `Layout` (dp, pp, tp): world size, coordinates, mesh."""
        return Layout(dp=self.dp, pp=self.pp, tp=self.tp)

    @classmethod
    def of(cls, layout: Layout, **rest: object) -> Plan3D:
        """The plan of `layout`'s dp, pp and tp (an axis it does not name: 1), with the other fields in
        `rest` (m, schedule, zero_stage, sequence_parallel)."""
        return cls(dp=layout.size("dp"), pp=layout.size("pp"), tp=layout.size("tp"), **rest)  # type: ignore[arg-type]

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def label(self) -> str:
        return self.layout.label("dp", "pp", "tp")


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer; use {name}=1 not to split over it")
    return value


def block_ranges(n_layer: int, pp: int) -> list[range]:
    """The blocks of each pipeline stage: contiguous, sizes differing by at most one, larger ones first
    (n_layer=5, pp=2: blocks 0-2 on stage 0, 3-4 on stage 1)."""
    _positive("pp", pp)
    if n_layer < pp:
        raise ValueError(f"n_layer={n_layer} blocks cannot fill pp={pp} pipeline stages (each needs a "
                         f"block); use pp <= {n_layer} or a model with at least {pp} layers")
    q, r = divmod(n_layer, pp)
    starts = [s * q + min(s, r) for s in range(pp + 1)]
    return [range(starts[s], starts[s + 1]) for s in range(pp)]


def _check_shape(batch: int, seq: int) -> None:
    for name, value, what in (("batch", batch, "sequences"), ("seq", seq, "tokens per sequence")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer (the global batch's {what}); "
                             f"e.g. {name}=8")


def check_plan(plan: Plan3D, config: GPTConfig, batch: int, seq: int, world_size: int | None = None) -> None:
    """Raise a ValueError naming the first thing in `plan` that does not fit the model, the batch of
    `batch` sequences of `seq` tokens, or the world of `world_size` ranks."""
    _check_grid(plan, world_size)
    _check_model(plan, config)
    _check_batch(plan, config, batch, seq)


def _check_grid(plan: Plan3D, world_size: int | None) -> None:
    """The sizes, the world, the schedule and the ZeRO stage."""
    for name in ("dp", "pp", "tp", "m"):
        _positive(name, getattr(plan, name))
    if world_size is not None and plan.world_size != world_size:
        raise ValueError(f"dp x pp x tp = {plan.dp} x {plan.pp} x {plan.tp} = {plan.world_size}, "
                         f"but the world has world_size={world_size} ranks; choose sizes whose "
                         f"product is {world_size}")
    if plan.schedule not in SCHEDULES_3D:
        raise ValueError(f"schedule={plan.schedule!r} is not supported in 3D; choose one of "
                         f"{', '.join(SCHEDULES_3D)}")
    if isinstance(plan.zero_stage, bool) or plan.zero_stage not in ZERO_STAGES_3D:
        raise ValueError(f"zero_stage={plan.zero_stage!r} is not supported with a pipeline; choose "
                         "0, 1 or 2 (stage 3 would gather every layer 2m times per step: "
                         "see distlab.parallel3d.config)")


def _check_model(plan: Plan3D, config: GPTConfig) -> None:
    """The model splits into pp stages and tp shards, and computes what one process computes."""
    block_ranges(config.n_layer, plan.pp)
    for name, value in (("n_head", config.n_head), ("vocab_size", config.vocab_size),
                        ("n_embd", config.n_embd)):
        if value % plan.tp:
            raise ValueError(f"{name}={value} is not divisible by tp={plan.tp}; each tensor-parallel rank "
                             f"holds {name}/tp of it: choose a tp that divides {value}")
    if config.dropout:
        raise ValueError(f"dropout={config.dropout}: the ranks would draw different masks than one process; "
                         "use dropout=0.0")


def _check_batch(plan: Plan3D, config: GPTConfig, batch: int, seq: int) -> None:
    """The batch splits over dp replicas and m micro-batches, and the sequence fits (and splits over tp)."""
    _check_shape(batch, seq)
    if batch % plan.dp:
        raise ValueError(f"batch={batch} sequences is not divisible by dp={plan.dp}; every replica takes "
                         f"batch/dp of them: use a batch that is a multiple of {plan.dp}")
    per_replica = batch // plan.dp
    if per_replica % plan.m:
        raise ValueError(f"m={plan.m} micro-batches do not divide the {per_replica} sequences of each "
                         f"replica (batch={batch} / dp={plan.dp}); choose m from "
                         f"{[d for d in range(1, per_replica + 1) if per_replica % d == 0]}")
    if seq > config.block_size:
        raise ValueError(f"seq={seq} exceeds block_size={config.block_size}; use seq <= {config.block_size}")
    if plan.sequence_parallel and seq % plan.tp:
        raise ValueError(f"seq={seq} is not divisible by tp={plan.tp}; sequence parallelism keeps seq/tp "
                         f"positions per rank: use a seq that is a multiple of {plan.tp}")
