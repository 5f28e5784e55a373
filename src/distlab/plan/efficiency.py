"""eta, the fraction of peak FLOP/s that a transformer block's kernels reach, one number per GPU type, from
one timed block and never fitted to the runs the planner is judged against.

Both measured GPU types are judged on the same work: one block of Korthikanti et al.'s 22B GPT (h = 6144,
a = 64, s = 2048, b = 4) as one GPU of a tensor-parallel group of t = 8 runs it, forward and backward.

- **A100, published.** Korthikanti et al. 2022, Table 4, row "Sequence Parallelism" (no recomputation;
  Table 3: micro-batch 4, t = 8, p = 1, mixed precision on Selene's DGX A100 servers): 7.2 ms forward,
  11.8 ms backward. Those times include the block's eight tensor-parallel collectives (2 all-gathers and 2
  reduce-scatters each way), which the planner prices as a term of its own; `kernel_efficiency` takes them
  out with the same ring model and links the planner uses.
- **H100, measured here.** `make gpu-check` (`distlab.gpu_check.block.time_block`) timed the same block's
  share on one NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, CUDA 13.0, bf16, flash attention through
  `scaled_dot_product_attention`): 1.891 ms forward, 3.819 ms backward, medians of 10 steps. The kernels
  ran alone, with no communication at all, so nothing is subtracted. The report is committed as
  `assets/gpu/nvidia-h100-80gb-hbm3-x1.json` (key "block"); `tests/plan/test_plan_published.py` holds this
  table to it.

Then, with P the catalog's dense 16-bit peak and W the block's matrix weights (12 h^2 here),

    eta = 3 b s (2 W + 4 s h) / t / (P (t_forward + t_backward - t_tp))

which gives 0.57 for the A100 and 0.52 for the H100 (`EFFICIENCY`). The V100 has neither a published nor a
measured block and carries the A100's value, marked `carried`; the H200 (the H100's chip with more memory),
B200 and GB200 carry the H100's the same way until a gpu-check report times a block on them. `python -m
distlab.plan --efficiency X` overrides any of them. The same gpu-check also timed Llama 3 405B's block (GQA,
SwiGLU, s = 8192, b = 1, t = 8; `SHAPE_STUDY`): 0.65 on the H100, because its larger matrix multiplies run
closer to peak. One constant per GPU type cannot see that; chapter 9 shows what each choice predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab import catalog
from distlab.collectives.cost_model import MachineParams, ring_all_gather_time, ring_reduce_scatter_time
from distlab.model_shape import block_weights
from distlab.topology import Latencies

H100_REPORT = "assets/gpu/nvidia-h100-80gb-hbm3-x1.json"
_H100_RUN = "make gpu-check on one NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, CUDA 13.0, bf16"


@dataclass(frozen=True)
class BlockTiming:
    """One timed transformer block, forward and backward, on one GPU of a tensor-parallel group of `tp`;
    `name` is the block's name in the source (the gpu-check report's row for a measurement here).
    `includes_tp_communication`: whether the times include the block's tensor-parallel collectives (a
    published end-to-end layer time) or are the kernels alone (gpu-check runs no communication)."""

    name: str
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
    includes_tp_communication: bool = True
    kv_heads: int | None = None  # None: as many as query heads
    ffn: int | None = None  # None: 4 h
    gated: bool = False


_KORTHIKANTI_22B = dict(name="korthikanti-22b", hidden=6144, heads=64, seq=2048, micro_batch=4, tp=8)
MEASURED = (
    BlockTiming(gpu="A100", forward_ms=7.2, backward_ms=11.8, source="korthikanti2022reducing",
                where="Table 4, row 'Sequence Parallelism' (no recomputation), 22B model, micro-batch 4 "
                      "(Table 3)", **_KORTHIKANTI_22B),
    BlockTiming(gpu="H100", forward_ms=1.891, backward_ms=3.819, source=H100_REPORT,
                where=f"{_H100_RUN}; block korthikanti-22b, kernels only", includes_tp_communication=False,
                **_KORTHIKANTI_22B),
)

# Not behind any constant: Llama 3 405B's block (Dubey et al. 2024, Table 3) timed by the same gpu-check,
# to show how much eta depends on the shape (chapter 9, "The limits of the model").
SHAPE_STUDY = (
    BlockTiming(name="llama3-405b", gpu="H100", hidden=16384, heads=128, seq=8192, micro_batch=1, tp=8,
                forward_ms=10.919, backward_ms=22.183, source=H100_REPORT,
                where=f"{_H100_RUN}; block llama3-405b, kernels only", includes_tp_communication=False,
                kv_heads=8, ffn=53248, gated=True),
)


def block_flops(t: BlockTiming) -> float:
    """Forward and backward FLOPs of the block on one GPU: 3 b s (2 W + 4 s h) / t (24 b s h^2 for W)."""
    b, s, h = t.micro_batch, t.seq, t.hidden
    w = block_weights(h, t.heads, t.kv_heads, t.ffn, t.gated)
    return 3 * b * s * (2 * w + 4 * s * h) / t.tp


def tp_seconds(t: BlockTiming) -> float:
    """The block's 4 all-gathers and 4 reduce-scatters of b s h bf16 elements on the GPU's NVLink; 0 when
    the timing left communication out."""
    if not t.includes_tp_communication:
        return 0.0
    gbps = catalog.lookup("nvlink", catalog.lookup("gpu", t.gpu).nvlink).gpu_GBps_per_direction
    net = MachineParams(Latencies().nvlink, 1e-9 / gbps)
    n = t.micro_batch * t.seq * t.hidden * 2
    return 4 * float(ring_all_gather_time(n, t.tp, net) + ring_reduce_scatter_time(n, t.tp, net))


def kernel_efficiency(t: BlockTiming) -> float:
    """eta of one timed block (module docstring)."""
    peak = catalog.lookup("gpu", t.gpu).dense_16bit_tflops * 1e12
    seconds = (t.forward_ms + t.backward_ms) * 1e-3 - tp_seconds(t)
    return block_flops(t) / seconds / peak


@dataclass(frozen=True)
class Efficiency:
    """eta for one GPU type, where it comes from, and whether it is carried from another GPU's timing."""

    gpu: str
    eta: float
    source: str
    where: str
    carried: bool = False


def _table() -> dict[str, Efficiency]:
    out = {t.gpu: Efficiency(t.gpu, round(kernel_efficiency(t), 2), t.source, t.where) for t in MEASURED}
    a100 = out["A100"]
    out["V100"] = Efficiency("V100", a100.eta, a100.source, f"the A100's value ({a100.where}), carried",
                             carried=True)
    h100 = out["H100"]
    for gpu in ("H200", "B200", "GB200"):  # no block timed on them yet: --efficiency overrides
        out[gpu] = Efficiency(gpu, h100.eta, h100.source, f"the H100's value ({h100.where}), carried",
                              carried=True)
    return out


EFFICIENCY = _table()


def efficiency_for(gpu: str) -> float:
    """eta for `gpu` (`EFFICIENCY`); a ValueError naming the known types otherwise."""
    if gpu not in EFFICIENCY:
        raise ValueError(f"gpu={gpu!r} has no efficiency in distlab.plan.efficiency.EFFICIENCY; choose one "
                         f"of {', '.join(EFFICIENCY)} or give --efficiency")
    return EFFICIENCY[gpu].eta
