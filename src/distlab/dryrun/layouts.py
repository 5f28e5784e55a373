"""Published layouts as the course's 3D trainer runs them: a `GPTConfig`, a `Plan3D` and a global batch.

`from_published(name)` reads one row of `distlab.plan.published.RUNS` (the team's dp, pp, tp, ZeRO stage,
micro-batch and global batch, with its source) and the model shape of `distlab.plan.inputs.PRESETS`
(layers, hidden, heads, vocabulary, sequence length), and turns them into what chapter 9's `Trainer3D`
takes. The trainer trains the course's GPT (GPT-2's block: multi-head attention, a 4h GELU MLP, tied
embeddings, learned positions; Radford et al. 2019), so a published model is run with its *shape* in that
block. For the Megatron-LM and MT-NLG rows that is the published model (Narayanan et al. 2021, Table 1;
Smith et al. 2022); Llama 3 405B's block is different (SwiGLU with f = 53,248, 8 key/value heads, RoPE,
untied output; Dubey et al. 2024, sec. 3.2) and `describe` says so. Three adjustments, each stated:

- the vocabulary is padded to a multiple of tp, as Megatron-LM pads it (its `--make-vocab-size-divisible-by`),
  because each tensor-parallel rank holds V/tp rows;
- the schedule is 1F1B: the trainer has no interleaved schedule (Megatron's v model chunks per rank), so
  a row with `interleave > 1` runs plain 1F1B: the same bytes on dp and tp, but v times fewer pipeline
  messages (an interleaved step crosses each of a rank's v chunk boundaries; Narayanan et al. 2021,
  sec. 2.2) and fewer micro-batches in flight on the first stage;
- context parallelism is not in the trainer: a row with cp > 1 (Llama 3 at 128K tokens) is refused.

`layers=` runs the same layout at reduced depth (at least pp blocks), which the tests use to stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from distlab.dryrun.attention import check_attention
from distlab.layout import Layout
from distlab.memory.estimate.estimator import MemoryConfig
from distlab.model_shape import ModelShape
from distlab.models import GPTConfig
from distlab.parallel3d.config import Plan3D, block_ranges, check_plan
from distlab.plan.inputs import ModelSpec, preset
from distlab.plan.published import RUNS, lookup

__all__ = ["DryLayout", "dry_run_names", "estimator_config", "from_published"]


@dataclass(frozen=True)
class DryLayout:
    """One 3D layout to dry-run: the model, the plan, the global batch (sequences of `seq` tokens), and
    where the numbers come from."""

    name: str
    config: GPTConfig
    plan: Plan3D
    batch: int
    seq: int
    source: str = ""
    note: str = ""
    gpu: str = ""  # the published run's GPU, whose HBM the held bytes must fit in ("" for a toy layout)
    hbm_bytes: float = 0.0  # that GPU's memory in bytes (distlab.plan's catalogue); 0 when unknown

    @property
    def layout(self) -> Layout:
        """The plan's sizes as the course's one `Layout`."""
        return self.plan.layout

    @property
    def model_shape(self) -> ModelShape:
        """The trained model's sizes as the course's one `ModelShape` (the GPT's, from its config)."""
        return ModelShape.from_gpt_config(self.config)

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def coords(self, rank: int) -> dict[str, int]:
        """(pp, dp, tp) of global `rank` on `distlab.mesh.grid`'s layout (pp outermost, tp innermost):
        `Layout.coords`, after a check that names this layout."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank!r} is not a rank of {self.name}'s {self.world_size} ranks; choose "
                             f"0 <= rank < {self.world_size}")
        return self.layout.coords(rank)

    def describe(self) -> str:
        c, p = self.config, self.plan
        return (f"{self.name}: {c.n_layer} blocks of h={c.n_embd}, {c.n_head} heads, "
                f"vocabulary {c.vocab_size}, {self.seq} tokens; {p.label()} = {self.world_size} ranks, "
                f"ZeRO-{p.zero_stage}, "
                f"m={p.m} micro-batches of {self.batch // (p.dp * p.m)} per step ({p.schedule})")


def dry_run_names() -> list[str]:
    """The published rows the trainer can run (those without context parallelism)."""
    return [r.name for r in RUNS if r.cp == 1]


def from_published(name: str, layers: int | None = None, microbatches: int | None = None) -> DryLayout:
    """The published run `name` (`distlab.plan.published`) as a `DryLayout`; `layers` < the model's
    depth runs the same layout with fewer blocks (at least pp), `microbatches` with fewer micro-batches
    per step (a smaller global batch: dp x microbatches x the run's micro-batch size)."""
    run = lookup(name)
    if run.cp != 1:
        raise ValueError(f"published={name!r} uses context parallelism (cp={run.cp}), which chapter 9's "
                         f"trainer does not have; choose one of {', '.join(dry_run_names())}")
    spec = preset(run.model)
    depth = spec.layers if layers is None else layers
    if not _whole_in(depth, run.pp, spec.layers):
        raise ValueError(f"layers={layers!r} must be a whole number from pp={run.pp} (one block per "
                         f"stage) to the model's {spec.layers}; or leave it out for the full depth")
    vocab = -(-spec.vocab // run.tp) * run.tp
    config = replace(spec.model_shape.in_gpt_block(), layers=depth, vocab=vocab).to_gpt_config(dropout=0.0)
    m = run.batch // (run.dp * run.micro_batch)
    if microbatches is not None:
        if not _whole_in(microbatches, 1, m):
            raise ValueError(f"microbatches={microbatches!r} must be a whole number from 1 to the run's "
                             f"m={m}; or leave it out for the published batch")
        m = microbatches
    batch = run.dp * m * run.micro_batch
    plan = Plan3D(dp=run.dp, pp=run.pp, tp=run.tp, m=m, schedule="1f1b", zero_stage=run.zero,
                  sequence_parallel=False)
    check_plan(plan, config, batch, spec.seq, plan.world_size)
    return DryLayout(name, config, plan, batch, spec.seq, f"{run.source}, {run.where}",
                     _shape_note(run.note, spec), run.gpu, run.cluster().memory_bytes)


def _whole_in(x: object, low: int, high: int) -> bool:
    """Whether `x` is an int (not a bool) from `low` to `high`."""
    return isinstance(x, int) and not isinstance(x, bool) and low <= x <= high


def _shape_note(note: str, spec: ModelSpec) -> str:
    """The run's note, plus a word where the course's GPT block differs from the paper's."""
    if spec.gated or spec.kv_heads not in (None, spec.heads) or not spec.tied:
        note = (f"{note}; " if note else "") + ("its shape in the course's GPT block (the paper's block "
                                                "has SwiGLU, grouped-query attention, untied output)")
    return note


def estimator_config(layout: DryLayout, attention: str = "flash") -> MemoryConfig:
    """Chapter 7's `MemoryConfig` for the same layout: the trainer's float32 Adam (4 + 4 + 8 bytes per
    parameter, precision "fp32"), no recomputation, no dropout, attention as the dry run ran it
    (`attention="flash"`: the fused kernel's log-sum-exp, as a real CPU or GPU run saves; "math": the
    a s^2 b probabilities of the path the meta device takes by itself), 1F1B with m micro-batches, and the
    split of `parallel3d.config.block_ranges` (given even when it is even, so that the estimator answers
    per stage: `estimator.stage_activations`)."""
    check_attention(attention)
    c, p = layout.config, layout.plan
    split = tuple(len(r) for r in block_ranges(c.n_layer, p.pp))  # given even when even: per-stage answers
    return MemoryConfig(layers=c.n_layer, hidden=c.n_embd, heads=c.n_head, vocab=c.vocab_size,
                        seq=layout.seq, micro_batch=layout.batch // (p.dp * p.m), **layout.layout.sizes,
                        zero=p.zero_stage,
                        precision="fp32", recompute="none", schedule="1f1b", microbatches=p.m,
                        attention=attention, dropout=False,
                        layer_split=split)
