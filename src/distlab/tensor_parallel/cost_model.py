"""The cost model of tensor parallelism: how many bytes it moves (recorded, and derived) and how long.

A `distlab.comm_log` records every collective that `f`, `g` and the sequence-parallel operators actually
run. `expected_records` derives the same list from the shapes alone (Shoeybi et al. 2019, sec. 3; Korthikanti
et al. 2022, sec. 4.2.2). Per transformer layer and training step, with b sequences of s tokens and
hidden size h:

- plain tensor parallelism: 2 all-reduces forward (g after attention, g after the MLP) and 2 backward
  (f before each), each of a b x s x h tensor;
- with sequence parallelism: each all-reduce becomes a reduce-scatter plus an all-gather of the same
  b x s x h tensor, so 4 collectives in each direction and the same number of bytes on the wire.

Around the layers: the embedding's g (forward) and the output layer's f (backward), each b x s x h, the
three all-reduces of b x s numbers in the vocabulary-parallel cross-entropy, and with sequence
parallelism one all-reduce of the gradients of the replicated parameters.

`wire_bytes` turns a collective's size n into the bytes each rank sends with a ring (chapter 1, by
`distlab.comm_log.ring_bytes`): 2 (p-1)/p n for an all-reduce, (p-1)/p n for an all-gather or a
reduce-scatter; `predicted_time` prices the records with `distlab.collectives.cost_model`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from distlab import catalog
from distlab.collectives import cost_model as ring_cost
from distlab.collectives.cost_model import MachineParams
from distlab.comm_log import CommRecord, ring_bytes
from distlab.models import GPTConfig

PHASES = ("forward", "backward")


def expected_records(config: GPTConfig, batch: int, seq: int, tp_size: int, sequence_parallel: bool = False,
                     dtype_bytes: int = 4) -> list[CommRecord]:
    """The collectives of one forward and backward step of `ParallelGPT`, derived from the shapes, as the
    `CommRecord`s a `comm_log` records (on the axis "tp"; dtype left unknown, "")."""
    bsh = batch * seq * config.n_embd
    out: list[CommRecord] = []

    def add(op: str, phase: str, where: str, numel: int) -> None:
        out.append(CommRecord(op, "tp", tp_size, numel * dtype_bytes, numel, where, phase))

    into, out_of = ("all_gather", "reduce_scatter") if sequence_parallel else ("all_reduce", "all_reduce")
    # forward: the collective that leaves each region (g), and (with SP) the one that enters it
    add(out_of, "forward", "wte", bsh)
    for i in range(config.n_layer):
        for sub, first, last in (("attn", "c_attn", "c_proj"), ("mlp", "c_fc", "c_proj")):
            if sequence_parallel:
                add(into, "forward", f"h.{i}.{sub}.{first}", bsh)
            add(out_of, "forward", f"h.{i}.{sub}.{last}", bsh)
            # backward: f (or the reduce-scatter) before the first layer, and with SP the all-gather after
            add(out_of if sequence_parallel else "all_reduce", "backward", f"h.{i}.{sub}.{first}", bsh)
            if sequence_parallel:
                add(into, "backward", f"h.{i}.{sub}.{last}", bsh)
    if sequence_parallel:
        add(into, "forward", "lm_head", bsh)
        add(into, "backward", "wte", bsh)
    add(out_of if sequence_parallel else "all_reduce", "backward", "lm_head", bsh)
    for _ in range(3):  # max, target logit, sum of exponentials: one number per token each
        add("all_reduce", "forward", "loss", batch * seq)
    if sequence_parallel:
        add("all_reduce", "backward", "sp-grads", sequence_parallel_param_count(config))
    return out


def sequence_parallel_param_count(config: GPTConfig) -> int:
    """Elements of the replicated parameters whose gradients sequence parallelism must all-reduce: the
    position embedding, every LayerNorm, and the biases of the row-parallel layers."""
    h = config.n_embd
    norm = 2 * h if config.bias else h
    per_layer = 2 * norm + (2 * h if config.bias else 0)
    return config.block_size * h + config.n_layer * per_layer + norm


def summary(records: Iterable[CommRecord]) -> Counter:
    """Counter of (phase, op, where, numel) -> number of calls: what a step did, in any order."""
    return Counter((r.phase, r.op, r.where, r.numel) for r in records)


def per_layer_collectives(batch: int, seq: int, hidden: int, sequence_parallel: bool = False
                          ) -> dict[str, list[tuple[str, int]]]:
    """The analytic count for one transformer layer: {phase: [(op, elements), ...]}."""
    bsh = batch * seq * hidden
    ops = ["all_gather", "reduce_scatter"] * 2 if sequence_parallel else ["all_reduce"] * 2
    return {phase: [(op, bsh) for op in ops] for phase in PHASES}


def wire_bytes(op: str, nbytes: float, p: int) -> float:
    """Bytes each rank sends for a collective about n = `nbytes` bytes on p ranks, with a ring
    (Patarasuk & Yuan 2009; chapter 1): 2(p-1)/p n for all-reduce, (p-1)/p n for the halves."""
    if op not in ("all_reduce", "all_gather", "reduce_scatter"):
        raise ValueError(f"op={op!r} is not a collective tensor parallelism uses; "
                         "use 'all_reduce', 'all_gather' or 'reduce_scatter'")
    return ring_bytes(op, nbytes, p)


def layer_wire_bytes(batch: int, seq: int, hidden: int, p: int, dtype_bytes: int = 2,
                     sequence_parallel: bool = False) -> float:
    """Bytes one rank sends for one transformer layer, forward plus backward: 8 (p-1)/p b s h bytes per
    element size (the same with and without sequence parallelism)."""
    ops = per_layer_collectives(batch, seq, hidden, sequence_parallel)
    return sum(wire_bytes(op, n * dtype_bytes, p) for phase in PHASES for op, n in ops[phase])


def pipeline_stage_bytes(batch: int, seq: int, hidden: int, dtype_bytes: int = 2) -> float:
    """Bytes one pipeline stage sends per micro-batch of b sequences: its output activations forward and
    the gradient of its input backward, b s h elements each (Narayanan et al. 2021, sec. 3)."""
    return 2 * batch * seq * hidden * dtype_bytes


def predicted_time(records: Iterable[CommRecord], p: int, machine: MachineParams) -> float:
    """Seconds the recorded collectives take on p ranks under the ring cost model of chapter 1
    (`distlab.collectives.cost_model`, textbook form without segmentation)."""
    total = 0.0
    for r in records:
        if p == 1:
            continue
        if r.op == "all_reduce":
            total += ring_cost.ring_all_reduce_time(r.nbytes, p, machine)
        elif r.op == "all_gather":
            total += ring_cost.ring_all_gather_time(r.nbytes, p, machine)
        else:
            total += ring_cost.ring_reduce_scatter_time(r.nbytes, p, machine)
    return total


def layer_time(batch: int, seq: int, hidden: int, p: int, machine: MachineParams,
               dtype_bytes: int = 2) -> float:
    """Seconds of communication per transformer layer, forward plus backward: 4 ring all-reduces of
    b s h elements (chapter 1's 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma each)."""
    n = batch * seq * hidden * dtype_bytes
    return 4 * float(ring_cost.ring_all_reduce_time(n, p, machine)) if p > 1 else 0.0


def layer_flops(batch: int, seq: int, hidden: int) -> float:
    """Floating-point operations of one transformer layer, forward plus backward (backward = 2 x
    forward): 3 x (24 b s h^2 + 4 b s^2 h), Narayanan et al. 2021's count of one layer's matrix
    multiplies."""
    return 3 * (24 * batch * seq * hidden**2 + 4 * batch * seq**2 * hidden)


# Illustrative links for the figures, one direction, read from the hardware catalog (Chapter 8) so that no
# datasheet number is typed twice: an A100's 12 NVLink 3 links, and one DGX A100 HDR InfiniBand NIC.
# alpha = 5 us is an assumed latency, not a datasheet figure.
NVLINK_A100 = MachineParams(alpha=5e-6,
                            beta=1 / (catalog.lookup("nvlink", "NVLink 3").gpu_GBps_per_direction * 1e9))
INFINIBAND_HDR = MachineParams(alpha=5e-6,
                               beta=1 / (catalog.lookup("server", "DGX A100").nic_GBps_per_direction * 1e9))
A100_PEAK_FLOPS = catalog.lookup("gpu", "A100").dense_16bit_tflops * 1e12  # dense BF16/FP16 Tensor Core peak
