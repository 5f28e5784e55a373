"""The search space: every way to split a model over a cluster, and which of them fit in memory.

A `Candidate` is one choice of (dp, tp, pp, cp, ZeRO stage, recomputation, micro-batch size, interleaving
v, and optionally the layers of each pipeline stage). `enumerate_candidates` lists those with
dp tp pp cp = GPUs, tp dividing the heads (a tp group may span servers: the cost model prices its
placement), every stage holding at least v layers (uneven splits as
`distlab.memory.estimate.shape.stage_layers`), cp dividing the sequence, and dp x micro-batch at most the
global batch: when it does not divide the batch, each replica runs m = floor(B / (d b)) micro-batches and the
step trains d b m sequences (`Candidate.effective_batch`). `Rejections` counts, per rule, the candidates each
rule removed, so that
"0 configurations fit" can say why. `memory` asks chapter 7's estimator
(`distlab.memory.estimate.estimator.estimate`) for the bytes per GPU of one candidate; `fits` compares its
peak (`peak_bytes`, the step's largest live total on the GPU that holds the most) with the GPU's HBM.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from distlab.layout import Layout
from distlab.memory.estimate import shape
from distlab.memory.estimate.cost_model import RECOMPUTE
from distlab.memory.estimate.estimator import MemoryConfig, MemoryEstimate, estimate
from distlab.memory.estimate.optimizer_step import adam_form
from distlab.plan.inputs import ClusterSpec, ModelSpec, Workload
from distlab.plan.limits import divisors

CP_SPLITS = ("zigzag", "contiguous")


class Rejections(Counter):
    """How many candidates each rule of the search space (or the memory filter) removed, by rule."""

    def explain(self) -> str:
        """One line per rule, most removals first."""
        return "; ".join(f"{rule}: {n:,}" for rule, n in self.most_common()) or "no rule removed any"


@dataclass(frozen=True)
class Settings:
    """What the whole search assumes: sequence parallelism with tp (Korthikanti et al. 2022), the attention
    kernel chapter 7 counts ("flash": no s x s matrix saved), dropout, Adam's implementation (`adam`:
    torch's default on a GPU is foreach), and the fraction of HBM the step's peak may fill (the rest is
    left for the allocator's fragmentation, which the estimator leaves out)."""

    sequence_parallel: bool = True
    attention: str = "flash"
    dropout: bool = False
    usable_memory: float = 0.9
    cp_split: str = "zigzag"  # how the sequence is cut over cp ranks: zig-zag (balanced) or contiguous
    overlap_dp: bool = True  # whether the dp collectives overlap the backward (DDP, FSDP) or wait for it
    rounds: int | None = None  # interleaved schedule: micro-batches per round (Llama 3's N); None = pp
    fp8: bool = False  # FP8 linear layers: inputs saved in FP8 (chapter 7's estimator), ZeRO-3 gathers in FP8
    adam: str = "default"  # Adam's implementation (chapter 7's optimizer_step); default: torch's on a GPU

    def __post_init__(self) -> None:
        u = self.usable_memory
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ValueError(f"usable_memory={self.usable_memory!r} must be in (0, 1], the fraction of HBM "
                             "the estimate may fill, e.g. 0.9")
        adam_form(self.adam, "cuda")
        if self.cp_split not in CP_SPLITS:
            raise ValueError(f"cp_split={self.cp_split!r} is unknown; choose one of {', '.join(CP_SPLITS)}")


@dataclass(frozen=True)
class Candidate:
    """One parallel configuration; `microbatches(batch)` is m, the micro-batches per replica per step."""

    dp: int
    tp: int
    pp: int
    cp: int
    zero: int
    recompute: str
    micro_batch: int
    interleave: int = 1
    layer_split: tuple[int, ...] | None = None  # layers per stage; None = `shape.stage_layers`

    @property
    def layout(self) -> Layout:
        """The candidate's sizes as the course's one `Layout` (dp, tp, pp, cp)."""
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp)

    def microbatches(self, batch: int) -> int:
        """m = floor(B / (d b)): micro-batches per replica per step (the batch rounds down)."""
        return batch // (self.dp * self.micro_batch)

    def effective_batch(self, batch: int) -> int:
        """The sequences one step trains: d b m, the global batch rounded down to a multiple of d b."""
        return self.dp * self.micro_batch * self.microbatches(batch)

    def label(self) -> str:
        v = f" v{self.interleave}" if self.interleave > 1 else ""
        return (f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp} z{self.zero} {self.recompute} "
                f"b{self.micro_batch}{v}")

    def to_dict(self) -> dict[str, int | str | list[int] | None]:
        d = asdict(self)
        d["layer_split"] = list(self.layer_split) if self.layer_split else None
        return d


def check_fits_grid(model: ModelSpec, cluster: ClusterSpec, workload: Workload, c: Candidate) -> None:
    """Raise a ValueError naming the parameter and the fix when `c` breaks a rule of the search space."""
    n = cluster.gpus
    if c.layout.world_size != n:
        raise ValueError(f"dp*tp*pp*cp = {c.layout.world_size} but the cluster has {n} GPUs; "
                         "choose sizes whose product is the number of GPUs")
    if model.heads % c.tp:
        raise ValueError(f"tp={c.tp} does not divide heads={model.heads}; choose a tp that divides it")
    split = shape.stage_layers(model.layers, c.pp, c.layer_split)
    if min(split) < c.interleave:
        raise ValueError(f"interleave={c.interleave} needs at least {c.interleave} layers on every stage but "
                         f"the split {list(split)} has {min(split)}; choose a smaller v or pp")
    if c.interleave > 1 and (c.pp == 1 or c.microbatches(workload.batch) % c.pp):
        raise ValueError(f"interleave={c.interleave} needs pp > 1 and a number of micro-batches "
                         f"m={c.microbatches(workload.batch)} that pp={c.pp} divides (Narayanan et al. 2021, "
                         "sec. 2.2); choose the micro-batch size or v = 1")
    if model.seq % c.cp:
        raise ValueError(f"cp={c.cp} does not divide seq={model.seq}; choose a cp that divides it")
    if c.dp * c.micro_batch > workload.batch:
        raise ValueError(f"dp*micro_batch = {c.dp * c.micro_batch} exceeds batch={workload.batch}: some "
                         "replica would get no sequence; choose a smaller dp or micro-batch")
    if c.recompute not in RECOMPUTE:
        raise ValueError(f"recompute={c.recompute!r} is unknown; choose one of {', '.join(RECOMPUTE)}")
    if c.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero={c.zero!r} is not a ZeRO stage; choose 0, 1, 2 or 3")


def memory_config(model: ModelSpec, workload: Workload, c: Candidate, settings: Settings,
                  gpus_per_node: int = 8) -> MemoryConfig:
    """Chapter 7's description of candidate `c` (mixed precision; 1F1B, or interleaved when v > 1)."""
    even = c.layer_split is None and model.layers % (c.pp * c.interleave) == 0
    split = None if even else shape.stage_layers(model.layers, c.pp, c.layer_split)
    return MemoryConfig(
        layers=model.layers, hidden=model.hidden, heads=model.heads, vocab=model.vocab, seq=model.seq,
        **model.shape(), layer_split=split,
        micro_batch=c.micro_batch, dp=c.dp * c.cp, tp=c.tp, pp=c.pp, cp=c.cp, zero=c.zero, precision="mixed",
        recompute=c.recompute, schedule="interleaved" if c.interleave > 1 else "1f1b",
        microbatches=c.microbatches(workload.batch), interleave=c.interleave,
        sequence_parallel=settings.sequence_parallel and c.tp > 1, attention=settings.attention,
        dropout=settings.dropout, gpus_per_node=gpus_per_node,
        rounds=min(settings.rounds, c.pp) if (settings.rounds and c.interleave > 1) else None,
        fp8=settings.fp8, adam=settings.adam, device="cuda",
    )


def memory(model: ModelSpec, cluster: ClusterSpec, workload: Workload, c: Candidate,
           settings: Settings | None = None) -> MemoryEstimate:
    """Bytes per GPU of candidate `c`, from chapter 7's estimator."""
    settings = settings or Settings()
    return estimate(memory_config(model, workload, c, settings, cluster.gpus_per_node))


def fits(m: MemoryEstimate, cluster: ClusterSpec, settings: Settings | None = None) -> bool:
    """Whether the step's peak (the estimator's `peak_bytes`) stays within the usable part of the HBM."""
    return m.peak_bytes <= (settings or Settings()).usable_memory * cluster.memory_bytes


def enumerate_candidates(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                         zero_stages: tuple[int, ...] = (0, 1, 2, 3),
                         recomputes: tuple[str, ...] = RECOMPUTE, max_micro_batch: int = 8,
                         interleaves: tuple[int, ...] = (1, 2, 4), max_cp: int | None = None,
                         rejections: Rejections | None = None, uneven: bool = True,
                         micro_batch: int | None = None) -> Iterator[Candidate]:
    """Every candidate of the search space (module docstring). ZeRO stages 2 and 3 only without a
    pipeline (their gradient or parameter shards would be reduced or gathered once per micro-batch on
    every stage; DeepSpeed allows only stage 0 or 1 with its pipeline engine; pin one with
    `--zero` to price it anyway); stages above 0 only with d c > 1; interleaving only with pp > 1 and m
    divisible by pp (Narayanan et al. 2021, sec. 2.2.2); cp at most `max_cp` (None: any); uneven layer
    splits only with `uneven` (Megatron-LM 2021 needed p v to divide L). The micro-batch size b divides
    floor(B/d), at most `max_micro_batch`; `micro_batch`, if given, is the only size tried (it must divide
    floor(B/d)). `rejections`, if given, counts what each rule removed."""
    rej = rejections if rejections is not None else Rejections()
    n = cluster.gpus
    for tp in divisors(n):
        if model.heads % tp:
            rej["tp does not divide the heads"] += 1
            continue
        for pp in divisors(n // tp):
            if pp > model.layers or (not uneven and model.layers % pp):
                rej["pp exceeds the layers (or, with uneven=False, does not divide them)"] += 1
                continue
            for dp, cp in _dp_cp(model, workload, n // (tp * pp), max_cp, rej):
                yield from _inner(model, workload, dp, tp, pp, cp, zero_stages, recomputes,
                                  max_micro_batch, interleaves, rej, uneven, micro_batch)


def _dp_cp(model: ModelSpec, workload: Workload, rest: int, max_cp: int | None,
           rej: Rejections) -> Iterator[tuple[int, int]]:
    """The (dp, cp) splits of the `rest` GPUs left by tp and pp that the cp and dp rules allow."""
    for cp in divisors(rest):
        dp = rest // cp
        if model.seq % cp or (max_cp is not None and cp > max_cp):
            rej["cp does not divide the sequence (or exceeds --max-cp)"] += 1
        elif dp > workload.batch:
            rej["dp exceeds the global batch"] += 1
        else:
            yield dp, cp


def _inner(model: ModelSpec, workload: Workload, dp: int, tp: int, pp: int, cp: int,
           zero_stages: tuple[int, ...], recomputes: tuple[str, ...], max_micro_batch: int,
           interleaves: tuple[int, ...], rej: Rejections, uneven: bool = True, micro_batch: int | None = None
           ) -> Iterator[Candidate]:
    """The candidates of one grid (dp, tp, pp, cp): every micro-batch size b (or only `micro_batch`),
    interleaving v, ZeRO stage and recomputation that the rules allow."""
    share = workload.batch // dp
    fewest = min(shape.stage_layers(model.layers, pp))
    if micro_batch is not None and share % micro_batch:
        rej["the micro-batch does not divide a replica's share of the batch"] += 1
        return
    sizes = [micro_batch] if micro_batch is not None else [d for d in divisors(share) if d <= max_micro_batch]
    for b in sizes:
        m = share // b
        for v in interleaves:
            if not _can_interleave(v, pp, fewest, m, model.layers, uneven):
                rej["interleaving needs pp > 1, v layers per stage and pp dividing m"] += 1
                continue
            yield from _zero_and_recompute(dp, tp, pp, cp, b, v, zero_stages, recomputes, rej)


def _can_interleave(v: int, pp: int, fewest: int, m: int, layers: int, uneven: bool) -> bool:
    """v = 1, or v > 1 chunks with a pipeline, at least v layers on every stage, pp dividing m (and, with
    uneven=False, pp v dividing the layers)."""
    return not (v > 1 and (pp == 1 or fewest < v or m % pp or (not uneven and layers % (pp * v))))


def _zero_and_recompute(dp: int, tp: int, pp: int, cp: int, b: int, v: int, zero_stages: tuple[int, ...],
                        recomputes: tuple[str, ...], rej: Rejections) -> Iterator[Candidate]:
    """Every ZeRO stage the grid allows (above 0 only with d c > 1; 2 and 3 only without a pipeline), with
    every recomputation."""
    for zero in zero_stages:
        if (zero > 0 and dp * cp == 1) or (zero > 1 and pp > 1):
            rej["ZeRO > 0 needs dp x cp > 1; ZeRO 2-3 no pipeline"] += len(recomputes)
            continue
        for rc in recomputes:
            yield Candidate(dp, tp, pp, cp, zero, rc, b, v)
