"""The planner's step time for a mixture of experts under parallel folding: compute on the active
parameters, the experts' all-to-all priced by where its group lies, and the assumptions a run claims.

A configuration (`MoEConfig`) is a `ModelShape` with `moe=`, a `Layout` whose `experts=ExpertFold(ep, etp)`
folds the experts over the same ranks as attention's tp x cp x dp x pp (edp derived), a cluster, the
global batch and the micro-batch. Per GPU and step, with N GPUs, P the dense 16-bit peak and eta the
kernels' efficiency (`distlab.plan.efficiency`, as the dense planner):

- **compute**: F / (N P eta) with F = 3 B s (2 A + L 2 s a (d_qk + d_v)): 6 FLOPs per active matrix
  weight and token (A = active parameters less the input embedding, which is a lookup; the experts a token
  does not visit cost nothing) and the attention scores and their product with V over the whole sequence,
  counted as the dense planner counts them (Narayanan et al. 2021, eq. (3): 4 s h per token and layer
  when a d = h). With FP8 (`MoEAssumptions.fp8`) the linear layers' share runs `speedup` times faster, the
  bf16 / FP8 time of an expert's GEMM at its size from chapter 7's `distlab.memory.fp8.cost_model`
  (measured kernel rates on the H100 and H200; on other GPUs the H100's, carried, as eta is carried),
  with its casts as separate kernels (`fp8_casts="separate"`, chapter 7's default) or fused away
  (`"fused"`, the FP8 GEMM alone: the best case, 2x on these sizes).
- **a2a**: per MoE layer and micro-batch 4 all-to-alls (dispatch and combine, forward and backward) of
  T k h b bytes per rank, T = b s / (tp cp) tokens (attention's tp ranks split their tokens for the MoE,
  as `distlab.moe.folded_block` does). The ep group is ep etp consecutive GPUs (Megatron-Core's
  "tp-cp-ep-dp-pp" order). Inside a node it moves (ep - 1)/ep of the bytes on NVLink. Across n nodes the
  bytes leaving the node are T E[min(J, M)] (n - 1)/n rows (one per node a token reaches, then forwarded
  on NVLink inside the node; node-limited routing caps J at M, chapter 6's `dispatch_cost.expected_nodes`)
  or T k (n - 1)/n without a cap, on the GPU's share of the NICs, while T k (m - 1)/m rows cross NVLink; the
  slower link sets the time. `fp8_dispatch`: the forward dispatch sends 1-byte values (DeepSeek-AI 2024,
  sec. 3.3.3, dispatch in FP8, combine in BF16).
- **overlap** (`MoEAssumptions.a2a_overlap`, what DualPipe claims: DeepSeek-AI 2024, sec. 3.2.1): one
  micro-batch's all-to-all runs during another's compute, so a layer exposes only what its all-to-all
  takes beyond its compute; without it the whole all-to-all waits.
- **tp**: 4 all-reduces of b (s/c) h bf16 values per layer and micro-batch (the dense planner's term),
  and with etp > 1 per MoE layer the experts' tensor-parallel collectives (`etp_seconds`): Megatron-Core's
  all-to-all dispatcher all-gathers the received rows over the etp group before the experts and
  reduce-scatters their outputs after (`MoEAlltoAllTokenDispatcher`, megatron/core/transformer/moe/
  token_dispatcher.py), and the backward does the same, 4 ring passes of the group's etp T k rows.
- **bubble**: the pipeline runs (m + (p - 1)/v) slots of its slowest stage (1F1B, interleaved); DualPipe
  (`pipeline="dualpipe"`) is priced (m + p/2 - 1) slots, its Table 2 bubble (PP/2 - 1)(F&B + B - 3W)
  taken as p/2 - 1 slots.
- **pp**: 2 v (m + p - 1) point-to-point transfers of b (s/c) h / t bf16 values.
- **dp**: the dense gradients' all-reduce over dp x cp and the experts' over edp (2 bytes each), ring
  times, overlapped with one micro-batch's backward as the dense planner's ZeRO-1 term.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from distlab.collectives.cost_model import ring_all_gather_time, ring_all_reduce_time
from distlab.layout import Layout
from distlab.memory.estimate import shape as stages
from distlab.memory.estimate.moe_states import check_moe_layout, stage_params
from distlab.memory.fp8 import cost_model as fp8_cost
from distlab.model_shape import ModelShape
from distlab.moe.dispatch_cost import expected_nodes
from distlab.moe.node_limited import NodeLayout
from distlab.plan.cost_model import link
from distlab.plan.efficiency import efficiency_for
from distlab.plan.inputs import ClusterSpec
from distlab.plan.moe_traffic import a2a_bytes, a2a_nodes, p2p_message_bytes

PIPELINES = ("1f1b", "dualpipe")
MOE_TERMS = ("compute", "bubble", "a2a", "tp", "pp", "dp")
FP8_CASTS = ("separate", "fused")
FP8_MEASURED = ("H100", "H200")  # GPUs with measured FP8 kernel rates (`distlab.kernel_rates.SPECS`)


@dataclass(frozen=True)
class MoEAssumptions:
    """What a run claims that the planner cannot see, stated and printed (`describe`)."""

    a2a_overlap: bool = False  # dispatch/combine hidden behind another micro-batch's compute (DualPipe)
    pipeline: str = "1f1b"  # "dualpipe": DeepSeek-V3's bidirectional pipeline and its smaller bubble
    max_nodes: int | None = None  # node-limited routing: each token's experts on at most M nodes
    fp8: bool = False  # FP8 linear layers, priced by chapter 7's FP8 cost model
    fp8_dispatch: bool = False  # the forward dispatch sends FP8 values (1 byte)
    fp8_casts: str = "separate"  # "separate": chapter 7's casts, one kernel per operand; "fused": none
    efficiency: float | None = None  # eta; None: the GPU type's (`distlab.plan.efficiency`)

    def __post_init__(self) -> None:
        if self.pipeline not in PIPELINES:
            raise ValueError(f"pipeline={self.pipeline!r} is unknown; choose one of {', '.join(PIPELINES)}")
        if self.fp8_casts not in FP8_CASTS:
            raise ValueError(f"fp8_casts={self.fp8_casts!r} is unknown; choose one of {', '.join(FP8_CASTS)}")

    def describe(self) -> str:
        """One line per assumption, as the planner prints them."""
        return "; ".join([
            "all-to-all hidden behind compute up to each layer's compute (DualPipe's claim)"
            if self.a2a_overlap else "all-to-all not overlapped (it waits)",
            "DualPipe bubble (m + p/2 - 1 slots)" if self.pipeline == "dualpipe"
            else "1F1B bubble ((p - 1)/v slots)",
            f"node-limited routing M = {self.max_nodes}" if self.max_nodes else "no node limit",
            (f"FP8 linear layers (chapter 7's FP8 cost, casts {self.fp8_casts})" if self.fp8
             else "BF16 linear layers"),
            "FP8 dispatch" if self.fp8_dispatch else "BF16 dispatch"])


@dataclass(frozen=True)
class MoEConfig:
    """One pinned MoE configuration: shape, folded layout, cluster, global batch (sequences of
    shape.seq), micro-batch and interleaving."""

    shape: ModelShape
    layout: Layout
    cluster: ClusterSpec
    batch: int
    micro_batch: int = 1
    interleave: int = 1

    def __post_init__(self) -> None:
        if self.shape.moe is None:
            raise ValueError("MoEConfig needs a ModelShape with moe=MoEShape(...); price a dense model with "
                             "distlab.plan.cost_model.step_time")
        if self.layout.world_size != self.cluster.gpus:
            raise ValueError(f"the layout has {self.layout.world_size} ranks but the cluster "
                             f"{self.cluster.gpus} GPUs; choose sizes whose product is the number of GPUs")
        check_moe_layout(self.shape, self.layout)
        if self.microbatches < 1:
            raise ValueError(f"batch={self.batch} is smaller than dp x micro_batch = "
                             f"{self.dp * self.micro_batch}; choose a larger batch or a smaller micro-batch")

    @property
    def dp(self) -> int:
        return self.layout.size("dp")

    @property
    def microbatches(self) -> int:
        """m per replica per step."""
        return self.batch // (self.dp * self.micro_batch)

    @property
    def tokens_per_rank(self) -> int:
        """T, the tokens one rank routes per micro-batch: b s / (tp cp)."""
        return self.micro_batch * self.shape.seq // (self.layout.size("tp") * self.layout.size("cp"))


@dataclass(frozen=True)
class MoEStepTime:
    """Seconds per step, term by term, the model FLOPs, the tokens of the step and the FP8 speed-up used."""

    compute: float
    bubble: float
    a2a: float
    tp: float
    pp: float
    dp: float
    model_flops: float
    tokens: int
    fp8_speedup: float

    @property
    def total(self) -> float:
        return sum(getattr(self, t) for t in MOE_TERMS)

    def tokens_per_s_per_gpu(self, gpus: int) -> float:
        return self.tokens / (self.total * gpus)


def attention_dims(ms: ModelShape) -> tuple[int, int]:
    """(d_qk, d_v) per head: MLA's nope + rope and v dims, else the head size."""
    m = ms.moe
    if m.mla is not None:
        return m.mla.qk_nope + m.mla.qk_rope, m.mla.v_dim
    d = m.head_dim or ms.hidden // ms.heads
    return d, d


def layer_flops_per_token(ms: ModelShape, moe_layer: bool) -> tuple[float, float]:
    """Forward FLOPs of one layer per token: (linear: 2 x its active matrix weights, attention:
    2 s a (d_qk + d_v))."""
    d_qk, d_v = attention_dims(ms)
    active = (ms.moe_layer_params - (ms.moe.experts - ms.moe.top_k) * ms.expert_params if moe_layer
              else ms.dense_layer_params)
    return 2 * active, 2 * ms.seq * ms.heads * (d_qk + d_v)


def _layers_flops(ms: ModelShape, dense: int, moe: int, head: bool) -> tuple[float, float]:
    """Forward (linear, attention) FLOPs per token of `dense` dense and `moe` MoE layers (and the output
    layer's 2 V h with `head`)."""
    (ld, ad), (lm, am) = layer_flops_per_token(ms, False), layer_flops_per_token(ms, True)
    return dense * ld + moe * lm + (2 * ms.vocab * ms.hidden if head else 0), dense * ad + moe * am


def model_flops(ms: ModelShape, tokens: int) -> float:
    """F = 3 tokens (the layers' forward FLOPs per token + 2 V h for the output layer)."""
    dense = ms.moe.dense_layers
    return 3 * tokens * sum(_layers_flops(ms, dense, ms.layers - dense, True))


def fp8_speedup(c: MoEConfig, casts: str = "separate") -> float:
    """bf16 / FP8 time of one expert GEMM (tokens per expert x h x F_e) from chapter 7's FP8 cost model,
    with its casts ("separate") or with the casts fused into the neighbouring kernels, as Transformer
    Engine does ("fused": the FP8 GEMM alone, the best case); on a GPU without measured FP8 kernel rates,
    the H100's at the same size (carried, module docstring)."""
    ms, e = c.shape, c.layout.expert_sizes
    m = c.tokens_per_rank * ms.moe.top_k * e["ep"] / ms.moe.experts
    gpu = c.cluster.gpu if c.cluster.gpu in FP8_MEASURED else "H100"
    t = fp8_cost.linear_times(m, ms.hidden, ms.moe.expert_ffn // e["etp"], gpu)
    return t["bf16"] / (t["fp8"] if casts == "separate" else t["fp8 gemm"])


@cache
def _reach(experts: int, nodes: int, k: int, max_nodes: int) -> float:
    """E[min(J, M)], chapter 6's `expected_nodes`, remembered: a search prices the same few groups often."""
    return expected_nodes(experts, nodes, k, max_nodes)


def a2a_seconds(c: MoEConfig, a: MoEAssumptions) -> float:
    """The 4 all-to-alls of one MoE layer and one micro-batch on one rank (module docstring)."""
    ms, e, gpn = c.shape, c.layout.expert_sizes, c.cluster.gpus_per_node
    t, k = c.tokens_per_rank, ms.moe.top_k
    if e["ep"] == 1:
        return 0.0
    n = a2a_nodes(c)
    nvl, net = c.cluster.intra, c.cluster.inter
    if n > 1:
        NodeLayout(ms.moe.experts, e["ep"], max(1, gpn // e["etp"]), k, a.max_nodes)  # checks M
    reach = _reach(ms.moe.experts, n, k, a.max_nodes) if n > 1 and a.max_nodes else k
    total = 0.0
    for buffer in a2a_bytes(c, a):
        row = buffer / (t * k)  # the bytes of one token's row
        if n == 1:
            total += nvl.alpha + t * k * (e["ep"] - 1) / e["ep"] * row * nvl.beta
            continue
        cross = t * reach * (n - 1) / n * row
        local = t * k * (gpn - 1) / gpn * row
        total += (n - 1) * net.alpha + max(cross * net.beta, local * nvl.beta)
    return total


def etp_seconds(c: MoEConfig) -> float:
    """The experts' tensor-parallel collectives of one MoE layer and micro-batch on one rank (module
    docstring): an all-gather and a reduce-scatter forward and backward, ring times, of the etp T k rows of
    h bf16 values the group's experts process, on NVLink when the group (etp consecutive ranks) stays in a
    server."""
    etp = c.layout.expert_sizes["etp"]
    if etp == 1:
        return 0.0
    nbytes = etp * c.tokens_per_rank * c.shape.moe.top_k * c.shape.hidden * 2
    return 4 * float(ring_all_gather_time(nbytes, etp, link(c.cluster, etp, 1)))


def _stages(c: MoEConfig) -> list[tuple[int, int, float, float]]:
    """Per pipeline stage: (layers, MoE layers, linear FLOPs, attention FLOPs) of one micro-batch's forward
    and backward on one of its ranks."""
    ms, lay = c.shape, c.layout
    split = stages.stage_layers(ms.layers, lay.size("pp"))
    tokens = c.micro_batch * ms.seq / (lay.size("tp") * lay.size("cp"))
    out, first = [], 0
    for i, n in enumerate(split):
        dense = max(0, min(n, ms.moe.dense_layers - first))
        lin, att = _layers_flops(ms, dense, n - dense, i == len(split) - 1)
        out.append((n, n - dense, 3 * tokens * lin, 3 * tokens * att))
        first += n
    return out


def _dp_seconds(c: MoEConfig, backward: float) -> float:
    """The gradients' all-reduces (dense over dp x cp, experts over edp) beyond one micro-batch's
    backward, on the stage that holds the most parameters."""
    lay, e = c.layout, c.layout.expert_sizes
    dense, experts = max(stage_params(c.shape, lay), key=lambda de: de[0] + de[1])
    group = lay.size("dp") * lay.size("cp")
    t = 0.0
    if group > 1:
        t += float(ring_all_reduce_time(2 * dense, group, link(c.cluster, group, lay.size("tp"))))
    if e["edp"] > 1:
        t += float(ring_all_reduce_time(2 * experts, e["edp"], link(c.cluster, e["edp"], e["ep"] * e["etp"])))
    return max(0.0, t - backward)


def moe_step_time(c: MoEConfig, a: MoEAssumptions | None = None) -> MoEStepTime:
    """Predicted seconds per step of `c` under the assumptions `a` (module docstring)."""
    a = a or MoEAssumptions()
    lay, cl, ms = c.layout, c.cluster, c.shape
    n, pp, v, m = cl.gpus, lay.size("pp"), c.interleave, c.microbatches
    rate = cl.peak_flops * (a.efficiency if a.efficiency is not None else efficiency_for(cl.gpu))
    speed = fp8_speedup(c, a.fp8_casts) if a.fp8 else 1.0
    tokens = c.dp * c.micro_batch * m * ms.seq
    dense = ms.moe.dense_layers
    lin, att = _layers_flops(ms, dense, ms.layers - dense, True)
    compute = 3 * tokens * (lin / speed + att) / (n * rate)
    a2a_layer = a2a_seconds(c, a)
    tp_size = lay.size("tp")
    act = p2p_message_bytes(c) * lay.size("tp")
    tp_layer = 4 * float(ring_all_reduce_time(act, tp_size, link(cl, tp_size, 1))) if tp_size > 1 else 0.0
    etp_layer = etp_seconds(c)
    slots, exposed, kernels, moe_layers = [], [], [], []
    for layers, moe_n, s_lin, s_att in _stages(c):
        work = (s_lin / speed + s_att) / rate
        hidden = max(0.0, a2a_layer - work / layers) if a.a2a_overlap else a2a_layer
        kernels.append(work)
        moe_layers.append(moe_n)
        exposed.append(moe_n * hidden)
        slots.append(work + moe_n * (hidden + etp_layer) + layers * tp_layer)
    slow = max(range(pp), key=lambda i: slots[i])
    fill = max(pp / 2 - 1, 0.0) if a.pipeline == "dualpipe" else (pp - 1) / v
    a2a = m * exposed[slow]
    tp = m * (stages.stage_layers(ms.layers, pp)[slow] * tp_layer + moe_layers[slow] * etp_layer)
    bubble = max(0.0, (m + fill) * slots[slow] - compute - a2a - tp)
    p2p = link(cl, pp, lay.world_size // pp)
    pp_t = 0.0 if pp == 1 else 2 * v * (m + pp - 1) * (p2p.alpha + p2p_message_bytes(c) * p2p.beta)
    dp = _dp_seconds(c, 2 / 3 * kernels[slow])
    return MoEStepTime(compute, bubble, a2a, tp, pp_t, dp, model_flops(ms, tokens), tokens, speed)
