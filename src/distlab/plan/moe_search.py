"""The planner's search over mixture-of-experts layouts: every way to fold attention and the experts over
the same GPUs, what fits, ranked by the predicted step (chapter 9, "Mixtures of experts in the planner").

A candidate (`MoECandidate`) is a pipeline of pp stages (the layers split as `shape.stage_layers` splits
them), attention's tp x dp over each stage's ranks, and the experts' etp x ep x edp over the same ranks
(parallel folding, Liu et al. 2025, arXiv 2504.14960; edp derived), a micro-batch size b, a ZeRO stage and
DeepSeek-V3's activation savings (`memory.estimate.moe_savings`). What is enumerated, and why:

- every pp, tp, ep and etp that divides the GPUs of a stage (or the sizes pinned); each (pp, tp, ep, etp) is
  a *layout*, checked by the rules of `violation` in order, and counted under the first it breaks: a pinned
  pp or tp that does not divide the GPUs (or a stage's), a stage without a layer,
  tp not dividing the heads, dp not dividing the global batch (every candidate then trains the same
  sequences, so their step times compare), ep not dividing the experts, etp not dividing the experts' FFN,
  pp ep etp not dividing the GPUs (edp not whole), and an ep x etp group that straddles servers unevenly
  (`moe_traffic.a2a_nodes`: the group is ep etp consecutive ranks, Megatron-Core's order, so where it lies,
  inside a server or across n of them, follows from the sizes);
- cp = 1 and one pipeline chunk per stage (v = 1): `moe_cost.moe_step_time` has no context-parallel
  term, and `moe_activations.moe_peak_bytes` counts 1F1B's in-flight micro-batches, not the interleaved
  schedule's; a search over either would rank by a cost or a memory the models do not have;
- per layout, every micro-batch size b dividing the replica's share B / dp (up to `max_micro_batch`) and,
  per b, the memory options in order of preference (`ladder`): the ZeRO stages offered (the MoE cost model
  prices 0 and 1 as one gradient all-reduce, so ZeRO-2 and 3 are not offered; by default ZeRO-1 alone,
  since at the same predicted time ZeRO-0 only holds more: DeepSeek-V3 and Megatron-Core both shard the
  optimizer state), with no saving, then recomputation, then FP8 caching, then both. None of them
  changes the predicted time (the recomputed RMSNorms and MLA up-projections are not priced), so the
  first that fits is the candidate and the heavier ones are counted as dominated; a larger b that does not
  fit stops the walk (its activations only grow). With both savings offered, the lightest option is tried
  first, and a miss there skips the walk.
- the node-limited routing of the assumptions (M servers per token) needs M servers to hold top-k experts;
  a layout whose group spreads the experts thinner is removed.

Memory is the memory chapter's own function: a candidate's `peak` is `moe_peak_bytes` for its layout,
micro-batch, micro-batches per step, ZeRO stage and savings, and `states` is `moe_states` (the rank of
the stage with the most model states); a candidate fits when its peak is at most `usable_memory` of the
GPU's HBM (the dense planner's 90 % rule). The layouts whose states alone do not fit are removed before
any activation is counted, and only what fits is priced (`moe_cost.moe_step_time`, under the stated
`MoEAssumptions`; a node limit M applies as min(M, the servers the ep group spans)). The rest is ranked
by step time, ties by the peak.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from distlab.expert_fold import ExpertFold
from distlab.layout import Layout
from distlab.memory.estimate import moe_savings
from distlab.memory.estimate.moe_activations import MoEPeak, moe_peak_bytes
from distlab.memory.estimate.moe_states import moe_states
from distlab.model_shape import ModelShape
from distlab.moe.published_runs import DEEPSEEK_V3, QWEN2_57B_A14B, QWEN3_30B_A3B, PublishedShape
from distlab.plan.inputs import ClusterSpec
from distlab.plan.limits import divisors
from distlab.plan.moe_cost import MOE_TERMS, MoEAssumptions, MoEConfig, MoEStepTime, moe_step_time
from distlab.plan.moe_traffic import a2a_nodes

MOE_MODELS: dict[str, PublishedShape] = {"deepseek-v3": DEEPSEEK_V3, "qwen3-30b-a3b": QWEN3_30B_A3B,
                                         "qwen2-57b-a14b": QWEN2_57B_A14B}  # shapes and sources: chapter 6
SAVINGS = {"none": moe_savings.NONE, "recompute": moe_savings.Savings(recompute=True),
           "fp8": moe_savings.Savings(fp8=True), "both": moe_savings.DEEPSEEK_V3_SAVINGS}
ZERO_STAGES = (0, 1)
AXES = ("pp", "tp", "ep", "etp")
DOMINATED = "config: a lighter ZeRO/savings option fits at the same predicted time"


def moe_model(name: str, seq: int = 4096) -> ModelShape:
    """The MoE model called `name` (`MOE_MODELS`) with sequences of `seq` tokens."""
    if name not in MOE_MODELS:
        raise ValueError(f"moe_model={name!r} is unknown; choose one of {', '.join(MOE_MODELS)}")
    return MOE_MODELS[name].model_shape(seq)


def _positive_or_none(name: str, v: object) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise ValueError(f"{name}={v!r} must be a positive integer (or None where allowed), e.g. 2")


@dataclass(frozen=True)
class SearchSpace:
    """What the search may try: ZeRO stages and savings (the memory ladder, in this order of preference),
    the largest micro-batch (or one pinned), the largest etp (None: a server's GPUs), pinned sizes of any
    of pp, tp, ep, etp, and the fraction of HBM a peak may fill."""

    zero: tuple[int, ...] = (1,)
    savings: tuple[str, ...] = tuple(SAVINGS)
    max_micro_batch: int = 4
    micro_batch: int | None = None
    max_etp: int | None = None
    pins: tuple[tuple[str, int], ...] = ()
    usable_memory: float = 0.9

    def __post_init__(self) -> None:
        if not self.zero or any(z not in ZERO_STAGES for z in self.zero):
            raise ValueError(f"zero={self.zero!r}: the MoE cost model prices ZeRO 0 and 1 (one gradient "
                             "all-reduce); choose among 0 1")
        if not self.savings or any(s not in SAVINGS for s in self.savings):
            raise ValueError(f"savings={self.savings!r}: choose among {', '.join(SAVINGS)}")
        for axis, _ in self.pins:
            if axis not in AXES:
                raise ValueError(f"pin {axis!r} is not searched; pin one of {', '.join(AXES)}")
        for name in ("max_micro_batch", "micro_batch", "max_etp"):
            _positive_or_none(name, getattr(self, name))
        if not 0 < self.usable_memory <= 1:
            raise ValueError(f"usable_memory={self.usable_memory!r} must be in (0, 1], e.g. 0.9")

    def ladder(self) -> list[tuple[int, str]]:
        """(ZeRO stage, savings) in the order tried: the savings outermost, so ZeRO-1 comes before them."""
        return [(z, s) for s in self.savings for z in self.zero]

    def sizes(self, axis: str, ranks: int, gpus_per_node: int) -> list[int]:
        """The sizes tried along `axis` for a stage of `ranks` GPUs: a pin, or every divisor."""
        pinned = dict(self.pins).get(axis)
        if pinned is not None:
            return [pinned]  # checked by `violation`, and counted there when it does not divide
        cap = (self.max_etp or gpus_per_node) if axis == "etp" else ranks
        return [d for d in divisors(ranks) if d <= cap]


@dataclass(frozen=True)
class MoECandidate:
    """One folded layout with its micro-batch, ZeRO stage and savings."""

    pp: int
    tp: int
    dp: int
    ep: int
    etp: int
    micro_batch: int = 1
    zero: int = 1
    savings: str = "none"

    @property
    def layout(self) -> Layout:
        return Layout(dp=self.dp, pp=self.pp, tp=self.tp, cp=1, experts=ExpertFold(self.ep, self.etp))

    def label(self) -> str:
        return (f"pp{self.pp} tp{self.tp} dp{self.dp} ep{self.ep} etp{self.etp} edp{self.layout.edp} "
                f"b{self.micro_batch} z{self.zero} {self.savings}")


@dataclass(frozen=True)
class MoERow:
    """A candidate that fits, its predicted step and its memory (`peak`: `moe_peak_bytes`; `states`:
    `moe_states`), and the servers its ep group spans."""

    candidate: MoECandidate
    time: MoEStepTime
    peak: MoEPeak
    states: float
    a2a_nodes: int
    gpus: int

    def to_dict(self) -> dict[str, Any]:
        c = self.candidate
        sizes = ("pp", "tp", "dp", "ep", "etp", "micro_batch", "zero", "savings")
        return {"label": c.label(), **{k: getattr(c, k) for k in sizes},
                "edp": c.layout.edp, "step_s": self.time.total, "terms_s": {k: getattr(self.time, k)
                                                                            for k in MOE_TERMS},
                "tokens_per_s_per_gpu": self.time.tokens_per_s_per_gpu(self.gpus),
                "peak_bytes": self.peak.peak_bytes, "model_states_bytes": self.states,
                "a2a_nodes": self.a2a_nodes}


def violation(ms: ModelShape, cluster: ClusterSpec, batch: int, pp: int, tp: int, ep: int, etp: int,
              max_nodes: int | None = None) -> str | None:
    """The first rule (module docstring) the layout (pp, tp, ep, etp) breaks, or None; with a node limit
    `max_nodes` also a group whose M servers hold fewer than top-k experts."""
    ranks, gpn = cluster.gpus // pp, cluster.gpus_per_node
    per_server = ms.moe.experts // ep * max(1, gpn // etp)
    rules = (
        (cluster.gpus % pp != 0, f"pp does not divide the {cluster.gpus} GPUs"),
        (pp > ms.layers, f"pp exceeds the {ms.layers} layers"),
        (ranks % tp != 0, "tp does not divide a stage's GPUs"),
        (ms.heads % tp != 0, f"tp does not divide the {ms.heads} heads"),
        (batch % (ranks // tp) != 0, f"dp does not divide the batch of {batch}"),
        (ms.moe.experts % ep != 0, f"ep does not divide the {ms.moe.experts} experts"),
        (ms.moe.expert_ffn % etp != 0, f"etp does not divide the experts' FFN of {ms.moe.expert_ffn}"),
        (ranks % (ep * etp) != 0, "pp x ep x etp does not divide the GPUs (edp not whole)"),
        (not _whole_servers(ep * etp, gpn), "the ep x etp group straddles servers"),
        (bool(max_nodes) and ep * etp > gpn and per_server * min(max_nodes, ep * etp // gpn) < ms.moe.top_k,
         f"node-limited routing: M = {max_nodes} servers hold fewer than top-k = {ms.moe.top_k} experts"),
    )
    return next((why for broken, why in rules if broken), None)


def _whole_servers(span: int, gpn: int) -> bool:
    return (span <= gpn and gpn % span == 0) or (span > gpn and span % gpn == 0)


def layouts(ms: ModelShape, cluster: ClusterSpec, batch: int, space: SearchSpace, removed: Counter,
            max_nodes: int | None = None) -> list[MoECandidate]:
    """Every (pp, tp, ep, etp) of the search space that breaks no rule (b, ZeRO and savings still open);
    each one that breaks a rule counted in `removed` under "layout: <rule>"."""
    n, gpn, out = cluster.gpus, cluster.gpus_per_node, []
    for pp in space.sizes("pp", n, gpn):
        ranks = n // pp
        for tp in space.sizes("tp", ranks, gpn):
            for ep in space.sizes("ep", ranks, gpn):
                for etp in space.sizes("etp", ranks, gpn):
                    why = violation(ms, cluster, batch, pp, tp, ep, etp, max_nodes)
                    if why:
                        removed["layout: " + why] += 1
                    else:
                        out.append(MoECandidate(pp, tp, ranks // tp, ep, etp))
    return out


def _first_fit(ms: ModelShape, lay: Layout, b: int, m: int, ladder: list[tuple[int, str]], budget: float
               ) -> tuple[int | None, MoEPeak | None]:
    """The index in `ladder` of the first (ZeRO, savings) whose peak fits, and that peak; (None, None) when
    none does. When the ladder offers both savings, its lightest option (the highest ZeRO stage with both,
    which holds less of every term than any other) is tried first, and a miss there ends the walk."""
    z_top = max((z for z, _ in ladder), default=None)
    if (z_top, "both") in ladder and moe_peak_bytes(ms, lay, b, m, z_top,
                                                    savings=SAVINGS["both"]).peak_bytes > budget:
        return None, None
    for j, (z, s) in enumerate(ladder):
        peak = moe_peak_bytes(ms, lay, b, m, z, savings=SAVINGS[s])
        if peak.peak_bytes <= budget:
            return j, peak
    return None, None


def _micro_batches(space: SearchSpace, share: int) -> list[int]:
    """The micro-batch sizes tried for a replica's `share` of the batch: the pinned one if it divides it,
    else every divisor up to the largest allowed."""
    if space.micro_batch:
        return [space.micro_batch] if share % space.micro_batch == 0 else []
    return [b for b in divisors(share) if b <= space.max_micro_batch]


def _fitting(ms: ModelShape, batch: int, layout: MoECandidate, space: SearchSpace, budget: float,
             removed: Counter) -> list[tuple[MoECandidate, MoEPeak, float]]:
    """Per micro-batch size, the first option of the ladder that fits (module docstring)."""
    lay, share = layout.layout, batch // layout.dp
    states = {z: moe_states(ms, lay, z).model_states_bytes for z in space.zero}
    ladder = [(z, s) for z, s in space.ladder() if states[z] <= budget]
    sizes = _micro_batches(space, share)
    if not sizes:
        removed[f"layout: the micro-batch {space.micro_batch} does not divide a replica's share"] += 1
    removed["config: model states alone above the usable memory"] += len(sizes) * (len(space.ladder())
                                                                                   - len(ladder))
    out = []
    for i, b in enumerate(sizes):
        j, peak = _first_fit(ms, lay, b, share // b, ladder, budget)
        if j is None:  # a larger micro-batch only holds more
            removed["config: peak above the usable memory"] += (len(sizes) - i) * len(ladder)
            break
        removed["config: peak above the usable memory"] += j
        removed[DOMINATED] += len(ladder) - j - 1
        z, s = ladder[j]
        out.append((replace(layout, micro_batch=b, zero=z, savings=s), peak, states[z]))
    return out


def node_limit(a: MoEAssumptions, nodes: int) -> MoEAssumptions:
    """The assumptions for an ep group over `nodes` servers: a node limit M as min(M, nodes) (the cap
    cannot bind beyond the servers there are), none inside one server."""
    if a.max_nodes is None:
        return a
    return replace(a, max_nodes=min(a.max_nodes, nodes) if nodes > 1 else None)


def search(ms: ModelShape, cluster: ClusterSpec, batch: int, assumptions: MoEAssumptions | None = None,
           space: SearchSpace | None = None) -> tuple[list[MoERow], Counter]:
    """Every candidate that fits, ranked by predicted step time (ties by peak), and the count removed
    per rule (module docstring)."""
    if ms.moe is None:
        raise ValueError("search needs a ModelShape with moe=MoEShape(...); search a dense model with "
                         "distlab.plan.planner.plan")
    a, space, removed = assumptions or MoEAssumptions(), space or SearchSpace(), Counter()
    budget = space.usable_memory * cluster.memory_bytes
    rows = []
    for layout in layouts(ms, cluster, batch, space, removed, a.max_nodes):
        for cand, peak, states in _fitting(ms, batch, layout, space, budget, removed):
            config = MoEConfig(ms, cand.layout, cluster, batch, cand.micro_batch)
            nodes = a2a_nodes(config)
            rows.append(MoERow(cand, moe_step_time(config, node_limit(a, nodes)), peak, states, nodes,
                               cluster.gpus))
    rows.sort(key=lambda r: (r.time.total, r.peak.peak_bytes))
    return rows, +removed
