"""eta, the fraction of peak FLOP/s that a transformer block's kernels reach, one number per GPU type, from a
published measurement of one block and never fitted to the runs the planner is judged against.

Korthikanti et al. 2022 (Table 4) time one block of their 22B GPT (h = 6144, a = 64, s = 2048, b = 4,
t = 8, with sequence parallelism, math attention, dropout, bf16) on DGX A100 servers: 7.2 ms forward,
11.8 ms backward. Those times include the block's eight tensor-parallel collectives (2 all-gathers and 2
reduce-scatters each way), which the planner prices as its own term; `kernel_efficiency` takes them out
with the same ring model and links the planner uses, and divides the block's FLOPs by what is left:

    eta = (72 b s h^2 + 12 b s^2 h) / t / (P (t_forward + t_backward - t_tp))

which gives 0.57 for the A100 (`EFFICIENCY`). We found no such per-block measurement for the H100 (or
the V100) from a primary source and have no H100 to measure one on, so they carry the A100's value, marked
`carried`; `python -m distlab.plan --efficiency X` overrides it, and chapter 9 shows what the carried value
predicts for Llama 3.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab import catalog
from distlab.collectives.cost_model import MachineParams, ring_all_gather_time, ring_reduce_scatter_time
from distlab.hardware.topology import Latencies


@dataclass(frozen=True)
class BlockTiming:
    """A published time of one transformer block, forward and backward, on one GPU of a tp group."""

    gpu: str
    hidden: int
    heads: int
    seq: int
    micro_batch: int
    tp: int
    forward_ms: float
    backward_ms: float
    source: str
    where: str


MEASURED = (BlockTiming("A100", 6144, 64, 2048, 4, 8, 7.2, 11.8, "korthikanti2022reducing",
                        "Table 4, 22B model, sequence parallelism, no recomputation"),)


def block_flops(t: BlockTiming) -> float:
    """Forward and backward FLOPs of the block on one GPU: 3 (24 b s h^2 + 4 b s^2 h) / t."""
    b, s, h = t.micro_batch, t.seq, t.hidden
    return 3 * (24 * b * s * h * h + 4 * b * s * s * h) / t.tp


def tp_seconds(t: BlockTiming) -> float:
    """The block's 4 all-gathers and 4 reduce-scatters of b s h bf16 elements on the GPU's NVLink."""
    gbps = catalog.lookup("nvlink", catalog.lookup("gpu", t.gpu).nvlink).gpu_GBps_per_direction
    net = MachineParams(Latencies().nvlink, 1e-9 / gbps)
    n = t.micro_batch * t.seq * t.hidden * 2
    return 4 * float(ring_all_gather_time(n, t.tp, net) + ring_reduce_scatter_time(n, t.tp, net))


def kernel_efficiency(t: BlockTiming) -> float:
    """eta of one measured block (module docstring)."""
    peak = catalog.lookup("gpu", t.gpu).dense_16bit_tflops * 1e12
    seconds = (t.forward_ms + t.backward_ms) * 1e-3 - tp_seconds(t)
    return block_flops(t) / seconds / peak


@dataclass(frozen=True)
class Efficiency:
    """eta for one GPU type, where it comes from, and whether it is carried from another GPU's measurement."""

    gpu: str
    eta: float
    source: str
    where: str
    carried: bool = False


def _table() -> dict[str, Efficiency]:
    a100 = MEASURED[0]
    eta = round(kernel_efficiency(a100), 2)
    out = {"A100": Efficiency("A100", eta, a100.source, a100.where)}
    for gpu in ("V100", "H100"):
        where = f"the A100's value ({a100.where}), carried"
        out[gpu] = Efficiency(gpu, eta, a100.source, where, carried=True)
    return out


EFFICIENCY = _table()


def efficiency_for(gpu: str) -> float:
    """eta for `gpu` (`EFFICIENCY`); a ValueError naming the known types otherwise."""
    if gpu not in EFFICIENCY:
        raise ValueError(f"gpu={gpu!r} has no efficiency in distlab.plan.efficiency.EFFICIENCY; choose one "
                         f"of {', '.join(EFFICIENCY)} or give --efficiency")
    return EFFICIENCY[gpu].eta
