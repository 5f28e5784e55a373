"""What the published MoE rows imply without any model of the machine: parameters, data-parallel sizes,
experts per rank, and where each expert-parallel group lies (DeepSeek-AI 2024; Liu et al. 2025).

Parameters (`parameter_counts`), from a `PublishedShape` through its `ModelShape` (the counts live in
`distlab.moe_shape`), with SwiGLU FFNs (three hidden x width
matrices each) and RMSNorm weights:

- embedding V h, and an output head of V h more unless tied;
- per layer, attention: grouped-query q, k, v, o (h a d_h + 2 h g d_h + a d_h h, plus biases and q/k norms
  where the model has them), or multi-head latent attention (DeepSeek-AI 2024, sec. 2.1.1): h r_q, r_q
  a (d_nope + d_rope), h (r_kv + d_rope), r_kv a (d_nope + d_v), a d_v h, plus the two latent norms;
- per layer, the FFN: 3 h F for a dense layer; for an MoE layer the router h E, E routed experts of
  3 h F_e, the shared experts 3 h F_s each, and Qwen2-MoE's shared-expert gate h.

Active parameters are the total less the routed experts a token does not visit: (E - k) 3 h F_e per MoE
layer. Embeddings count as active, as DeepSeek-AI count them (36.7B "including 0.9B for Embedding and
0.9B for the output Head").

Placement (`expert_placement`): Megatron-Core numbers ranks with tp (or, for the experts, etp) fastest,
then ep (the README's orders "tp-cp-ep-dp-pp" and, folded, "tp-ep-dp-pp"), so an ep group is ep ranks
spaced etp apart: ep x etp consecutive GPUs. It stays inside a node when that product divides the GPUs per
node, and otherwise spans ep x etp / (GPUs per node) nodes. Where a row gives no etp, Megatron-Core's
default is assumed (etp = tp, `--expert-tensor-parallel-size` in its MoE README) and said so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distlab.moe.published_runs import PUBLISHED_RUNS, PublishedRun, PublishedShape


@dataclass(frozen=True)
class ParameterCount:
    """Parameters of a published shape: all of them, those one token uses, and the publisher's figures."""

    total: int
    active: int
    published_total: float | None
    published_active: float | None

    def ratio(self) -> tuple[float | None, float | None]:
        """(computed / published) for the total and the active count (None where none is published)."""
        return (None if not self.published_total else self.total / self.published_total,
                None if not self.published_active else self.active / self.published_active)


def parameter_counts(shape: PublishedShape) -> ParameterCount:
    """Total and active parameters of `shape` (module docstring), counted by the course's one model shape
    (`PublishedShape.model_shape()`, `distlab.moe_shape`)."""
    ms = shape.model_shape()
    return ParameterCount(ms.params, ms.active_params, shape.published_total, shape.published_active)


@dataclass(frozen=True)
class ExpertPlacement:
    """Where one run's experts sit: attention's dp, the experts' edp, experts per rank, and the ep group's
    span (`nodes` is 1 inside a node). `assumed` lists what the source left out and this filled in."""

    dp: int
    edp: int
    experts_per_rank: float
    nodes: int
    inside_node: bool
    assumed: tuple[str, ...] = ()


def data_parallel(r: PublishedRun) -> int | None:
    """Attention's dp = GPUs / (tp cp pp), or None where a size is unpublished."""
    if None in (r.gpus, r.tp, r.cp, r.pp):
        return None
    model = r.tp * r.cp * r.pp
    if r.gpus % model:
        raise ValueError(f"{r.name}: gpus={r.gpus} is not divisible by tp x cp x pp = {model}; check the row")
    return r.gpus // model


def expert_placement(r: PublishedRun) -> ExpertPlacement | None:
    """The run's expert layout (module docstring), or None where its sizes are not published."""
    dp = data_parallel(r)
    if dp is None or r.ep is None:
        return None
    assumed = () if r.etp is not None else ("etp = tp (not published; Megatron-Core's default)",)
    etp = r.etp if r.etp is not None else r.tp
    span = r.ep * etp
    if r.gpus % (span * r.pp):
        raise ValueError(f"{r.name}: gpus={r.gpus} is not divisible by ep x etp x pp = {span * r.pp}")
    experts = r.shape.experts / (r.ep * etp) if r.shape is not None else math.nan
    inside = r.gpus_per_node % span == 0
    return ExpertPlacement(dp, r.gpus // (span * r.pp), experts, 1 if inside else span // r.gpus_per_node,
                           inside, assumed)


def _layout(r: PublishedRun) -> str:
    if r.tp is None:
        return "not published"
    parts = [f"TP{r.tp}", f"CP{r.cp}", f"PP{r.pp}", f"EP{r.ep}"]
    if r.etp is not None:
        parts.append(f"ETP{r.etp}")
    return " ".join(parts) + f" DP{data_parallel(r)}"


def _throughput(r: PublishedRun) -> str:
    if r.tokens_per_s_per_gpu is not None:
        return f"{r.tokens_per_s_per_gpu:,.0f} tok/s/GPU"
    if r.mfu is not None:
        return f"MFU {r.mfu:.1%}"
    if r.gpu_hours_per_trillion_tokens is not None:
        return f"{r.gpu_hours_per_trillion_tokens / 1e3:,.0f}K GPU h per 1T tokens"
    return "not published"


def table_rows(runs: tuple[PublishedRun, ...] = PUBLISHED_RUNS) -> list[list[str]]:
    """One row of strings per run: name, GPUs, layout, batch x sequence, reported throughput, experts per
    rank and the ep group's span, parameters (computed) and the source."""
    rows = []
    for r in runs:
        place = expert_placement(r)
        where = "-" if place is None else ("inside a node" if place.inside_node else f"{place.nodes} nodes")
        known = place is not None and not math.isnan(place.experts_per_rank)
        per_rank = f"{place.experts_per_rank:g}" if known else "-"
        count = parameter_counts(r.shape) if r.shape is not None else None
        params = "-" if count is None else f"{count.total / 1e9:.1f}B / {count.active / 1e9:.1f}B"
        batch = "-" if r.global_batch is None else f"{r.global_batch:,} x {r.seq_len:,}"
        gpus = r.gpu if r.gpus is None else f"{r.gpus:,} {r.gpu}"
        rows.append([r.model, gpus, _layout(r), batch, _throughput(r), per_rank, where,
                     params, r.source])
    return rows


TABLE_HEADER = ["model", "GPUs", "layout", "batch x seq", "reported", "experts/rank", "ep group",
                "params total / active", "source"]


def markdown_table(runs: tuple[PublishedRun, ...] = PUBLISHED_RUNS) -> str:
    """The rows of `table_rows` as a Markdown table (what the lab prints)."""
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(runs)]
    return "\n".join(lines)
