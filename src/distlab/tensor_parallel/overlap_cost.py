"""When does a collective matmul pay? A cost model of the decomposition (Wang et al. 2023, sec. 3-4).

Symbols: p ranks; a matmul of m x k by k x n (m = b s tokens); e bytes per element. One ring step moves
one chunk of the activation, c bytes (c = n_bytes / p), and costs chapter 1's

    t_link = alpha + c beta                       (all-gather; a reduce-scatter adds c gamma for its sum)

A matmul costs, by a roofline with a fixed cost per call (Williams, Waterman & Patterson 2009):

    t_mm(m, k, n) = kappa + max(2 m k n / F, e (m k + k n + m n) / M)

with F the arithmetic throughput (FLOP/s), M the memory bandwidth (bytes/s) and kappa the cost of
launching one matmul. The decomposed version runs p matmuls of m/p rows, t_c = t_mm(m/p, k, n) each.

- Plain (blocking) all-gather then matmul: T = (p-1) t_link + t_mm; exposed communication (p-1) t_link.
- All-gather-matmul: p - 1 steps that each take max(t_c, t_link), then the last chunk's matmul:
  T = (p-1) max(t_c, t_link) + t_c; exposed communication (p-1) max(0, t_link - t_c).
- Matmul-reduce-scatter: the first chunk's matmul, then p - 1 steps of max(t_c, t_link) plus the sum
  of the incoming accumulator (c gamma, on the critical path): T = t_c + (p-1) (max(t_c, t_link) + c gamma).

The decomposition pays when what it hides, (p-1) min(t_c, t_link), exceeds what the smaller matmuls
cost extra, p t_c - t_mm: p - 1 more launches, and (when memory-bound) the weight read p times instead
of once. All pure Python: no processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab import catalog
from distlab.collectives.cost_model import MachineParams


@dataclass(frozen=True)
class Device:
    """What a matmul costs on one device: `flops` (FLOP/s reached by a large matmul), `memory_Bps`
    (bytes/s of memory bandwidth) and `launch_s` (seconds of fixed cost per matmul call)."""

    flops: float
    memory_Bps: float
    launch_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("flops", "memory_Bps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Device.{name}={getattr(self, name)!r} must be > 0")
        if not self.launch_s >= 0:
            raise ValueError(f"Device.launch_s={self.launch_s!r} must be >= 0 (seconds per matmul call)")


def gpu_device(name: str = "A100", launch_s: float = 5e-6) -> Device:
    """A GPU of the hardware catalog at its dense 16-bit peak and its memory bandwidth (datasheets, via
    `distlab.catalog`); launch_s = 5 us is an assumed kernel launch cost, not a datasheet figure."""
    gpu = catalog.lookup("gpu", name)
    return Device(gpu.dense_16bit_tflops * 1e12, gpu.memory_GBps * 1e9, launch_s)


def matmul_time(m: int, k: int, n: int, device: Device, dtype_bytes: int = 2) -> float:
    """Seconds of an (m, k) x (k, n) matmul: kappa + max(2 m k n / F, e (m k + k n + m n) / M)."""
    flops = 2 * m * k * n / device.flops
    memory = dtype_bytes * (m * k + k * n + m * n) / device.memory_Bps
    return device.launch_s + max(flops, memory)


@dataclass(frozen=True)
class OverlapPrediction:
    """Seconds of one collective matmul, blocking (`plain_s`) and decomposed (`overlapped_s`), and of
    the communication the compute waits on in each (`exposed_plain_s`, `exposed_overlapped_s`)."""

    plain_s: float
    overlapped_s: float
    exposed_plain_s: float
    exposed_overlapped_s: float
    matmul_s: float
    chunk_matmul_s: float
    link_step_s: float

    @property
    def pays(self) -> bool:
        """Whether the decomposed version is faster than the blocking one."""
        return self.overlapped_s < self.plain_s

    @property
    def speedup(self) -> float:
        """plain / overlapped: above 1 when the decomposition pays."""
        return self.plain_s / self.overlapped_s


def _check(p: int, nbytes: float, matmul_s: float, chunk_matmul_s: float) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p={p!r} must be a positive integer (the tensor-parallel size), e.g. p=4")
    for name, value in (("nbytes", nbytes), ("matmul_s", matmul_s), ("chunk_matmul_s", chunk_matmul_s)):
        if not value >= 0:
            raise ValueError(f"{name}={value!r} must be >= 0")


def all_gather_matmul_time(matmul_s: float, chunk_matmul_s: float, nbytes: float, p: int,
                           machine: MachineParams) -> OverlapPrediction:
    """An all-gather of `nbytes` (the gathered activation) then a matmul of `matmul_s` seconds, blocking
    and decomposed into p steps whose matmuls take `chunk_matmul_s` each (Wang et al. 2023)."""
    _check(p, nbytes, matmul_s, chunk_matmul_s)
    link = machine.alpha + nbytes / p * machine.beta if p > 1 else 0.0
    plain = (p - 1) * link + matmul_s
    overlapped = (p - 1) * max(chunk_matmul_s, link) + chunk_matmul_s
    return OverlapPrediction(plain, overlapped, (p - 1) * link, (p - 1) * max(0.0, link - chunk_matmul_s),
                             matmul_s, chunk_matmul_s, link)


def matmul_reduce_scatter_time(matmul_s: float, chunk_matmul_s: float, nbytes: float, p: int,
                               machine: MachineParams) -> OverlapPrediction:
    """A matmul of `matmul_s` seconds then a reduce-scatter of its `nbytes` output, blocking and
    decomposed into p steps whose matmuls take `chunk_matmul_s` each (Wang et al. 2023)."""
    _check(p, nbytes, matmul_s, chunk_matmul_s)
    link = machine.alpha + nbytes / p * machine.beta if p > 1 else 0.0
    add = nbytes / p * machine.gamma if p > 1 else 0.0
    plain = matmul_s + (p - 1) * (link + add)
    overlapped = chunk_matmul_s + (p - 1) * (max(chunk_matmul_s, link) + add)
    return OverlapPrediction(plain, overlapped, (p - 1) * (link + add),
                             (p - 1) * (max(0.0, link - chunk_matmul_s) + add),
                             matmul_s, chunk_matmul_s, link)


def mlp_forward(batch: int, seq: int, hidden: int, p: int, machine: MachineParams, device: Device,
                dtype_bytes: int = 2) -> dict[str, OverlapPrediction]:
    """The two collective matmuls of a sequence-parallel MLP's forward pass (Korthikanti et al. 2022):
    c_fc, an all-gather of the (b, s, h) input then (b s, h) x (h, 4h/p); c_proj, (b s, 4h/p) x (4h/p, h)
    then a reduce-scatter of the (b, s, h) output. The backward pass has the same two, transposed."""
    if hidden * 4 % p:
        raise ValueError(f"hidden={hidden}: 4 * hidden is not divisible by p={p}; choose a p that divides "
                         f"{4 * hidden}")
    m, ffn, nbytes = batch * seq, 4 * hidden // p, batch * seq * hidden * dtype_bytes
    if m % p:
        raise ValueError(f"batch * seq = {m} tokens is not divisible by p={p}; sequence parallelism gives "
                         f"each rank m/p tokens: use a multiple of {p}")

    def times(k: int, n: int) -> tuple[float, float]:
        return matmul_time(m, k, n, device, dtype_bytes), matmul_time(m // p, k, n, device, dtype_bytes)

    return {"c_fc": all_gather_matmul_time(*times(hidden, ffn), nbytes, p, machine),
            "c_proj": matmul_reduce_scatter_time(*times(ffn, hidden), nbytes, p, machine)}
