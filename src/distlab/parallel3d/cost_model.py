"""The bytes each rank sends in one 3D-parallel training step, per mesh axis and kind, from the shapes.

Per rank of pipeline stage s, with b = batch / (dp m) sequences per micro-batch, T tokens, hidden size h,
vocabulary V, element size e bytes (ring costs from chapter 1, Patarasuk & Yuan 2009):

- tp (Shoeybi et al. 2019, sec. 3; Korthikanti et al. 2022, sec. 4.2.2): for each of the m micro-batches,
  chapter 5's collectives (`tensor_parallel.cost_model.expected_records`) of the layers this stage holds:
  per block 4 all-reduces of b T h elements (or 4 all-gathers and 4 reduce-scatters with sequence
  parallelism), the embedding's on stage 0, the output layer's and the loss's three b T all-reduces on
  the last stage; an all-reduce of n elements sends 2 (tp-1)/tp n e bytes, a half 1 (tp-1)/tp n e. With
  sequence parallelism, once per step, one all-reduce of the stage's replicated parameters' gradients.
- pp (Narayanan et al. 2021, sec. 3.2): m activations of b (T/tp with SP, else T) h elements forward
  (every stage but the last) and m gradients back (every stage but the first); plus, when pp > 1, the
  tied embedding's gradient, V/tp x h, swapped once between the first and the last stage.
- dp (Rajbhandari et al. 2020, sec. 7): chapter 7's ZeRO on the stage's own parameters, one unit per
  block plus one for the rest, each padded to a multiple of dp elements (B bytes): stage 0 all-reduces
  each unit, 2 (dp-1)/dp B; stages 1 and 2 reduce-scatter and all-gather it, 2 x (dp-1)/dp B.

`predicted_traffic` returns these as `Transfer`s; `distlab.parallel3d.traffic` records the same from the
calls a step makes, and the tests check that the two agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.models import GPTConfig
from distlab.parallel3d.config import Plan3D, block_ranges
from distlab.tensor_parallel.cost_model import expected_records, wire_bytes

AXES = ("dp", "pp", "tp")  # mesh axes (CONTRIBUTING: an axis is a kind of parallelism)
RING_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (p - 1) steps of a ring


@dataclass
class Transfer:
    """What one rank sends over one mesh axis by one kind of call in one step: the number of calls, the
    bytes it sends (summed), and the latency-bound steps they take (a ring's 2(p-1) or (p-1); 1 per p2p)."""

    axis: str
    kind: str
    calls: int = 0
    sent_bytes: float = 0.0
    steps: int = 0

    def add(self, sent: float, steps: int) -> None:
        self.calls += 1
        self.sent_bytes += sent
        self.steps += steps


Traffic = dict[tuple[str, str], Transfer]


def add_collective(traffic: Traffic, axis: str, op: str, whole_bytes: float, p: int) -> None:
    """Count a ring collective about `whole_bytes` bytes on p ranks (nothing is sent when p = 1)."""
    if p > 1:
        traffic.setdefault((axis, op), Transfer(axis, op)).add(wire_bytes(op, whole_bytes, p),
                                                              RING_STEPS[op] * (p - 1))


def add_message(traffic: Traffic, axis: str, kind: str, nbytes: float) -> None:
    """Count one point-to-point message of `nbytes` bytes."""
    traffic.setdefault((axis, kind), Transfer(axis, kind)).add(nbytes, 1)


def block_numel(config: GPTConfig, tp: int) -> int:
    """Elements of one block's tp shard: c_attn 3h^2/tp, c_proj h^2/tp, c_fc and c_proj 4h^2/tp each,
    the column-parallel biases split, the row-parallel biases and the LayerNorms whole."""
    h, bias = config.n_embd, config.bias
    norm = 2 * h if bias else h
    weights = (3 + 1 + 4 + 4) * h * h // tp
    biases = ((3 * h + 4 * h) // tp + 2 * h) if bias else 0
    return weights + biases + 2 * norm


def replicated_numel(config: GPTConfig, stage: int, pp: int) -> int:
    """Elements of the stage's parameters that tp replicates (position embedding, LayerNorms, row-parallel
    biases): the gradients sequence parallelism sums over tp once per step."""
    h, bias = config.n_embd, config.bias
    norm = 2 * h if bias else h
    per_block = 2 * norm + (2 * h if bias else 0)
    n = len(block_ranges(config.n_layer, pp)[stage]) * per_block
    return n + (config.block_size * h if stage == 0 else 0) + (norm if stage == pp - 1 else 0)


def zero_units(config: GPTConfig, plan: Plan3D, stage: int) -> list[int]:
    """Elements of each ZeRO unit of the stage: the root (embeddings, final norm) if any, then each block."""
    h, V, tp = config.n_embd, config.vocab_size, plan.tp
    first, last = stage == 0, stage == plan.pp - 1
    root = (V // tp * h if first or last else 0) + (config.block_size * h if first else 0)
    root += ((2 * h if config.bias else h) if last else 0)
    blocks = [block_numel(config, tp)] * len(block_ranges(config.n_layer, plan.pp)[stage])
    return ([root] if root else []) + blocks


def predicted_traffic(config: GPTConfig, plan: Plan3D, batch: int, seq: int, stage: int,
                      dtype_bytes: int = 8) -> Traffic:
    """The traffic of one step of a rank of pipeline stage `stage` (see the module docstring)."""
    b = batch // (plan.dp * plan.m)
    traffic: Traffic = {}
    _tp_traffic(traffic, config, plan, b, seq, stage, dtype_bytes)
    _pp_traffic(traffic, config, plan, b, seq, stage, dtype_bytes)
    _dp_traffic(traffic, config, plan, stage, dtype_bytes)
    return traffic


def _tp_traffic(traffic: Traffic, config: GPTConfig, plan: Plan3D, b: int, seq: int, stage: int,
                dtype_bytes: int) -> None:
    """tp: chapter 5's collectives of the layers the stage holds, m times; with sequence parallelism
    also the once-per-step all-reduce of the replicated parameters' gradients."""
    tp, first, last = plan.tp, stage == 0, stage == plan.pp - 1
    mine = {f"h.{i}." for i in block_ranges(config.n_layer, plan.pp)[stage]}
    for r in expected_records(config, b, seq, tp, plan.sequence_parallel, dtype_bytes):
        ours = (any(r.where.startswith(p) for p in mine) or (r.where == "wte" and first)
                or (r.where in ("lm_head", "loss") and last))
        if ours:
            for _ in range(plan.m):
                add_collective(traffic, "tp", r.op, r.nbytes, tp)
    if plan.sequence_parallel:
        replicated = replicated_numel(config, stage, plan.pp) * dtype_bytes
        add_collective(traffic, "tp", "all_reduce", replicated, tp)


def _pp_traffic(traffic: Traffic, config: GPTConfig, plan: Plan3D, b: int, seq: int, stage: int,
                dtype_bytes: int) -> None:
    """pp: m activations forward and m gradients back, and the tied embedding's gradient between the
    first and the last stage."""
    tp, first, last = plan.tp, stage == 0, stage == plan.pp - 1
    act = b * (seq // tp if plan.sequence_parallel else seq) * config.n_embd * dtype_bytes
    for _ in range(plan.m if plan.pp > 1 else 0):
        if not last:
            add_message(traffic, "pp", "send_fwd", act)
        if not first:
            add_message(traffic, "pp", "send_bwd", act)
    if plan.pp > 1 and (first or last):
        add_message(traffic, "pp", "tied_grad", config.vocab_size // tp * config.n_embd * dtype_bytes)


def _dp_traffic(traffic: Traffic, config: GPTConfig, plan: Plan3D, stage: int, dtype_bytes: int) -> None:
    """dp: ZeRO's collectives on each unit of the stage, padded to a multiple of dp elements."""
    dp = plan.dp
    for numel in zero_units(config, plan, stage):
        padded = -(-numel // dp) * dp * dtype_bytes
        for op in (("all_reduce",) if plan.zero_stage == 0 else ("reduce_scatter", "all_gather")):
            add_collective(traffic, "dp", op, padded, dp)


def bytes_by_axis(traffic: Traffic) -> dict[str, float]:
    """Total bytes sent per mesh axis."""
    return {a: sum(t.sent_bytes for t in traffic.values() if t.axis == a) for a in AXES}
