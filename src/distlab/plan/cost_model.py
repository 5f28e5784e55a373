"""The planner's step-time model: one training step as a sum of separately reported terms.

FLOPs (Narayanan et al. 2021, eq. (3), for any block shape): a block's forward pass is 2 W + 4 s h FLOPs
per token, W its matrix weights (`distlab.memory.estimate.shape.block_weights`, 12 h^2 for GPT-3) and 4 s h
the attention scores and their product with V, counted over the whole sequence as the paper counts them; the
output layer adds 2 V h; backward is twice forward. So the model FLOPs of a step of B sequences are
F = 6 B s (L W + V h) + 12 B s^2 h L, and with context parallelism each of the c ranks does the attention of
its s/c queries against all s keys, a (s/c) s b. Recomputation adds one forward of every block (full) or
of the attention core, 4 B s^2 h L (selective; Korthikanti et al. 2022, sec. 5).

The terms, per GPU, with eta the kernels' efficiency and P the peak. eta is one measured constant per GPU
type (`distlab.plan.efficiency`), or with `Workload(kernels="parts")` the one `distlab.plan.kernel_time`
gives for the candidate's shapes (each part of a micro-batch priced where it runs), and the compute term
then also holds Adam's memory-bound step over the GPU's parameters:

- **compute**, **recompute**: F / (N P eta) and the recomputation FLOPs likewise: the work if every GPU
  were busy all the time.
- **tp**: per block and micro-batch 4 all-reduces of b (s/c) h 16-bit elements (6 with full
  recomputation; with sequence parallelism 4 all-gathers and 4 reduce-scatters, the same bytes), on the
  slowest stage, priced on the link the tp group's placement gives it: NVLink when every group stays in a
  server, the network when some group crosses (`parallel3d.placement.group_crosses_servers`). Not
  overlapped (Megatron-LM's tensor parallelism waits for each).
- **cp**: the ring of K and V (2 b (s/c) h_kv / t elements per step, c - 1 steps; once forward, twice
  backward, once more with full recomputation; Liu et al. 2023): each step overlaps the attention of the
  block it brings, so only what the transfer takes beyond that computation is exposed, plus the first step.
- **bubble**: everything else the pipeline waits for. The step of a pipeline is (m + (p - 1)/v) slots of
  its slowest stage (chapter 4's bubble, Narayanan et al. 2021 sec. 2.2), and a slot of stage i is its
  layers' compute, recomputation, tp and cp time; the first stage also runs the embedding, the last the
  output layer. The idle time is that minus the four terms above: the fill and drain, the wait for the
  stage with the most work (uneven splits), and with contiguous cp chunks the wait for the rank with the
  most causal attention ((2c - 1)/c of the mean; zig-zag chunks, as Llama 3 cuts them, balance it;
  Dubey et al. 2024, sec. 3.3.2).
- **pp**: 2 v (m + p - 1) point-to-point transfers of b (s/c) h / t elements (activations forward,
  gradients back), on the network when the pipeline crosses servers.
- **dp**: what the data-parallel collectives add that does not overlap, over the d c replicas of each
  parameter (context-parallel ranks hold the same parameters, so they reduce gradients too). ZeRO 0 and
  1: the gradient all-reduce (reduce-scatter + all-gather) overlaps the last micro-batch's backward, as
  DDP's buckets do, except the last bucket, one block's gradients. ZeRO 2: a reduce-scatter per
  micro-batch overlapping its backward, and the parameters' all-gather after the step. ZeRO 3 (FSDP,
  Zhao et al. 2023): every micro-batch gathers each block's parameters before its forward and again before
  its backward, and reduce-scatters its gradients after; the next block's gather is prefetched during the
  current block's compute, so per block only the excess of the transfers over the compute is exposed, plus
  the first gather of each pass and the last reduce-scatter.

`dp_time` is the wire time of the dp collectives without any overlap (the lab's exercise).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from distlab.collectives.cost_model import (  # chapter 1's ring formulas (their fast path on one float)
    MachineParams,
    ring_all_gather_time,
    ring_all_reduce_time,
    ring_reduce_scatter_time,
)
from distlab.memory.estimate import shape
from distlab.memory.estimate.estimator import params_per_gpu
from distlab.parallel3d.placement import group_crosses_servers
from distlab.plan import kernel_time
from distlab.plan.candidates import Candidate, Settings, memory_config
from distlab.plan.inputs import ClusterSpec, ModelSpec, Workload

TERMS = ("compute", "recompute", "bubble", "tp", "pp", "cp", "dp")


@dataclass(frozen=True)
class StepTime:
    """Seconds per step, term by term (see the module docstring), and the FLOPs they came from."""

    compute: float
    recompute: float
    bubble: float
    tp: float
    pp: float
    cp: float
    dp: float
    model_flops: float
    hardware_flops: float

    @property
    def total(self) -> float:
        return sum(getattr(self, t) for t in TERMS)

    def tflops_per_gpu(self, gpus: int, hardware: bool = False) -> float:
        """Achieved TFLOP/s per GPU: model FLOPs (or with recomputation counted) over the step time."""
        return (self.hardware_flops if hardware else self.model_flops) / (gpus * self.total) / 1e12

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def layer_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of one block per token: 2 W + 4 s h (module docstring)."""
    w = model.model_shape.block_weights
    return 2 * w + 4 * model.seq * model.hidden


def model_flops(model: ModelSpec, batch: int) -> float:
    """F = 3 B s (L (2 W + 4 s h) + 2 V h); for a GPT-3 block Narayanan et al.'s eq. (3) without its
    recomputation pass, 72 B s L h^2 (1 + s/(6h)) + 6 B s h V."""
    per_token = model.layers * layer_flops_per_token(model) + 2 * model.vocab * model.hidden
    return 3 * batch * model.seq * per_token


def recompute_flops(model: ModelSpec, batch: int, recompute: str) -> float:
    """The extra forward FLOPs of recomputation (module docstring)."""
    b, s, h, lyr = batch, model.seq, model.hidden, model.layers
    if recompute == "full":
        return b * s * lyr * layer_flops_per_token(model)
    return 4 * b * s * s * h * lyr if recompute == "selective" else 0.0


def link(cluster: ClusterSpec, group: int, inner: int) -> MachineParams:
    """NVLink if every group of `group` ranks, `inner` apart, stays in one server; the network otherwise."""
    return cluster.inter if group_crosses_servers(group, inner, cluster.gpus_per_node) else cluster.intra


def _p2p(nbytes: float, m: MachineParams) -> float:
    return m.alpha + nbytes * m.beta


def dp_time(c: Candidate, grad_bytes: float, m_micro: int, net: MachineParams) -> float:
    """The wire time of the data-parallel collectives for ZeRO stage c.zero, nothing overlapped: the ring
    all-reduce for ZeRO 0 and 1, m reduce-scatters and one all-gather for ZeRO 2, m reduce-scatters and
    2 m all-gathers for ZeRO 3 (Rajbhandari et al. 2020, sec. 7); nothing for dp = 1."""
    if c.dp == 1:
        return 0.0
    ar = ring_all_reduce_time(grad_bytes, c.dp, net)
    if c.zero <= 1:
        return float(ar)
    rs = ring_reduce_scatter_time(grad_bytes, c.dp, net)
    ag = ring_all_gather_time(grad_bytes, c.dp, net)
    return m_micro * rs + ag if c.zero == 2 else m_micro * (rs + 2 * ag)


@dataclass(frozen=True)
class _Stage:
    """One pipeline stage's seconds per micro-batch: kernels, tp, exposed cp; and its forward per block."""

    kernels: float
    tp: float
    cp: float
    block_forward: float
    layers: int

    @property
    def slot(self) -> float:
        return self.kernels + self.tp + self.cp


def _stages(model: ModelSpec, cluster: ClusterSpec, c: Candidate, rate: float, settings: Settings
            ) -> list[_Stage]:
    s, h, b, t, cp = model.seq, model.hidden, c.micro_batch, c.tp, c.cp
    per_token = layer_flops_per_token(model)
    attn = 4 * s * h  # per token and block, forward
    redo = {"full": per_token, "selective": attn}.get(c.recompute, 0.0)
    skew = (2 * cp - 1) / cp if (cp > 1 and settings.cp_split == "contiguous") else 1.0
    block = b * s * (3 * per_token + redo + (3 + (redo > 0)) * attn * (skew - 1)) / (t * cp * rate)
    head = b * s * 6 * model.vocab * h / (t * cp * rate)
    act = b * (s // cp) * h * 2
    tp_link = link(cluster, t, 1)
    tp_block = ((6 if c.recompute == "full" else 4) * ring_all_reduce_time(act, t, tp_link)
                if t > 1 else 0.0)
    cp_block = 0.0
    if cp > 1:
        kv = 2 * act * model.model_shape.kv_width / h / t
        step = _p2p(kv, link(cluster, cp, t))
        hidden = b * (s // cp) * (s // cp) * 4 * h / (t * rate)  # one step's attention, forward
        passes = 4 if c.recompute == "full" else 3
        cp_block = passes * (step + (cp - 2) * max(0.0, step - hidden))
    split = shape.stage_layers(model.layers, c.pp, c.layer_split)
    out = []
    for i, n in enumerate(split):
        extra = head if i == c.pp - 1 else 0.0
        out.append(_Stage(n * block + extra, n * tp_block, n * cp_block,
                          b * s * per_token / (t * cp * rate), n))
    return out


def _dp_exposed(c: Candidate, grad_bytes: float, m: int, net: MachineParams, stage: _Stage,
                overlap: bool, gather_bytes: float | None = None) -> float:
    """The data-parallel seconds that do not overlap compute (module docstring), over c.dp x c.cp ranks.
    `gather_bytes`: what ZeRO-3's parameter all-gathers move (None: `grad_bytes`; half with FP8 weights)."""
    group = c.dp * c.cp
    if group == 1:
        return 0.0
    layer_bytes = grad_bytes / max(stage.layers, 1)
    backward = 2 * stage.block_forward * stage.layers
    ar = ring_all_reduce_time(grad_bytes, group, net)
    rs = ring_reduce_scatter_time(grad_bytes, group, net)
    ag = ring_all_gather_time(grad_bytes, group, net)
    gather = grad_bytes if gather_bytes is None else gather_bytes
    if not overlap:
        flat = Candidate(group, 1, 1, 1, c.zero, c.recompute, 1)
        if c.zero == 3:  # m reduce-scatters of the gradients, 2 m all-gathers of the (FP8) weights
            return m * (ring_reduce_scatter_time(grad_bytes, group, net)
                        + 2 * ring_all_gather_time(gather, group, net))
        return dp_time(flat, grad_bytes, m, net)
    tail_ar = ring_all_reduce_time(layer_bytes, group, net)
    if c.zero <= 1:
        return max(tail_ar, ar - backward)
    tail_rs = ring_reduce_scatter_time(layer_bytes, group, net)
    if c.zero == 2:
        return m * max(tail_rs, rs - backward) + ag
    ag_l = ring_all_gather_time(gather / max(stage.layers, 1), group, net)
    f = stage.block_forward
    per_pass = (2 * ag_l + tail_rs + stage.layers * (max(0.0, ag_l - f) + max(0.0, ag_l + tail_rs - 2 * f)))
    return m * per_pass


def kernel_eta(model: ModelSpec, cluster: ClusterSpec, workload: Workload, c: Candidate, settings: Settings
               ) -> float:
    """eta for candidate `c`: the workload's (an explicit efficiency, or the GPU type's measured block), or
    with `kernels="parts"` the one `kernel_time` prices for this candidate's shapes (b, s/c, 1/t)."""
    if workload.kernels == "block" or workload.efficiency is not None:
        return workload.eta(cluster.gpu)
    rates = kernel_time.fallback_rates(cluster.gpu)
    return kernel_time.effective_efficiency(model, c.micro_batch, rates, c.tp, c.cp, settings.attention)


def optimizer_time(model: ModelSpec, cluster: ClusterSpec, workload: Workload, c: Candidate,
                   settings: Settings) -> float:
    """Adam's step over the parameters this GPU updates (its shard with ZeRO >= 1), bytes over HBM."""
    params = params_per_gpu(memory_config(model, workload, c, settings, cluster.gpus_per_node))
    shards = c.dp * c.cp if c.zero >= 1 else 1
    return kernel_time.optimizer_seconds(params / shards, kernel_time.fallback_rates(cluster.gpu))


def step_time(model: ModelSpec, cluster: ClusterSpec, workload: Workload, c: Candidate,
              settings: Settings | None = None) -> StepTime:
    """The predicted seconds per step of candidate `c`, term by term (module docstring)."""
    settings = settings or Settings()
    n = cluster.gpus
    m = c.microbatches(workload.batch)
    batch = c.dp * c.micro_batch * m  # the global batch rounded down to a multiple of dp x micro-batch
    rate = cluster.peak_flops * kernel_eta(model, cluster, workload, c, settings)
    f, fr = model_flops(model, batch), recompute_flops(model, batch, c.recompute)
    compute, recompute = f / (n * rate), fr / (n * rate)
    if workload.kernels == "parts" and workload.efficiency is None:
        compute += optimizer_time(model, cluster, workload, c, settings)
    stages = _stages(model, cluster, c, rate, settings)
    slow = max(stages, key=lambda st: st.slot)
    pipeline = (m + (c.pp - 1) / c.interleave) * slow.slot
    tp, cp = m * slow.tp, m * slow.cp
    bubble = max(0.0, pipeline - compute - recompute - tp - cp)
    act = c.micro_batch * (model.seq // c.cp) * model.hidden * 2
    pp = 0.0 if c.pp == 1 else 2 * c.interleave * (m + c.pp - 1) * _p2p(
        act / c.tp, link(cluster, c.pp, c.tp * c.cp * c.dp))
    grads = 2 * params_per_gpu(memory_config(model, workload, c, settings, cluster.gpus_per_node))
    gather = grads / 2 if settings.fp8 else None  # FP8 weights: 1 byte per parameter (distlab.memory.fp8)
    dp = _dp_exposed(c, grads, m, link(cluster, c.dp * c.cp, c.tp), slow, settings.overlap_dp, gather)
    return StepTime(compute, recompute, bubble, tp, pp, cp, dp, f, f + fr)
