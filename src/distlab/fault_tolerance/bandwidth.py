"""The bandwidth cost model of section 3: bytes per step, step time, and the link speed below which a
method that communicates less reaches a loss sooner than data parallelism.

Symbols: N parameters, R replicas (the data-parallel copies that talk over the slow link), H inner steps
per synchronisation, K fragments, b bytes per value on the wire, c seconds of compute per inner step,
L the link's bandwidth (bytes/s, one direction). With ring all-reduces (Patarasuk & Yuan 2009) each
replica sends 2 (R-1)/R B for a buffer of B bytes (`distlab.comm_log.ring_bytes`), so per inner step:

    data parallelism   V_dp = 2 (R-1)/R N b_grad                (gradients, every step)
    local SGD, DiLoCo  V    = 2 (R-1)/R N b / H                  (parameters or pseudo-gradients, every H)
    streaming DiLoCo   V    = 2 (R-1)/R N b / H, in bursts of 1/K of it (one fragment at a time)
    PowerSGD           V    = 2 (R-1)/R b sum over matrices of r (n + m)   (Vogels et al. 2019)

and an inner step lasts t = c + V / L when the sends do not overlap the compute (ours do not). A method
that needs 1/eta times the tokens of data parallelism to reach the same loss (eta <= 1, its token
efficiency: the lab measures it) is sooner when (c + V/L) / eta < c + V_dp / L, that is when

    L < L* = (V_dp - V / eta) / (c (1/eta - 1)).

With eta = 1 it is sooner at every speed; with V_dp <= V / eta at none. Compute time is modelled with
Kaplan et al. 2020's 6 N flops per token (forward and backward) at a fraction `mfu` of the GPU's peak
(`distlab.catalog`); the cluster's all-reduce comes from chapter 8's `hardware.cost_model`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from distlab import catalog
from distlab.comm_log import ring_bytes
from distlab.fault_tolerance.local_sgd import check_sync_every

METHODS = ("dp", "powersgd", "local_sgd", "diloco", "streaming")


def _check(method: str, replicas: int, efficiency: float = 1.0) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {', '.join(METHODS)}; pick one of them")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas={replicas!r} must be a positive integer, e.g. 2 (two sites)")
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency={efficiency!r} must be in (0, 1]: the tokens data parallelism needs "
                         "for a loss over the tokens the method needs for it (1: as good as DP)")


def powersgd_values(shapes: Iterable[tuple[int, ...]], rank: int) -> int:
    """Values PowerSGD all-reduces per step: r (n + m) for an n x m matrix where that is smaller than
    n m, the whole tensor otherwise (as `distlab.data_parallel.powersgd.PowerSGD` does)."""
    total = 0
    for shape in shapes:
        numel = math.prod(shape)
        n, m = (shape[0], numel // shape[0]) if len(shape) >= 2 else (1, numel)
        total += rank * (n + m) if len(shape) >= 2 and rank * (n + m) < n * m else numel
    return total


def sent_bytes_per_step(method: str, n_params: int, replicas: int, sync_every: int = 1,
                        bytes_per_value: int = 4, values: int | None = None) -> float:
    """Bytes one replica sends per inner step, averaged over a round of H steps (ring all-reduce).
    `values` replaces N for PowerSGD (`powersgd_values`)."""
    _check(method, replicas)
    h = 1 if method in ("dp", "powersgd") else check_sync_every(sync_every)
    count = values if values is not None else n_params
    return ring_bytes("all_reduce", count * bytes_per_value, replicas) / h


def peak_bytes(method: str, n_params: int, replicas: int, fragments: int = 1, bytes_per_value: int = 4
               ) -> float:
    """Bytes one replica sends in its largest single synchronisation (streaming: one fragment)."""
    _check(method, replicas)
    k = fragments if method == "streaming" else 1
    return ring_bytes("all_reduce", n_params * bytes_per_value / k, replicas)


def step_seconds(compute_s: float, sent_bytes: float, link_GBps: float) -> float:
    """One inner step when sending does not overlap computing: c + V / L (L in GB/s, per direction)."""
    if not link_GBps > 0:
        raise ValueError(f"link_GBps={link_GBps!r} must be positive (GB/s per direction), e.g. 1.25 for "
                         "10 Gb/s")
    return compute_s + sent_bytes / (link_GBps * 1e9)


def break_even_GBps(compute_s: float, dp_bytes: float, method_bytes: float, efficiency: float) -> float:
    """L* in GB/s (per direction): below it the method reaches DP's loss sooner; inf if it always does
    (efficiency 1), 0 if it never does."""
    _check("dp", 1, efficiency)
    if efficiency == 1:
        return math.inf if method_bytes < dp_bytes else 0.0
    gain = dp_bytes - method_bytes / efficiency
    return max(0.0, gain / (compute_s * (1 / efficiency - 1)) / 1e9)


def compute_seconds(n_params: float, tokens: float, gpu: str = "H100", mfu: float = 0.4) -> float:
    """6 N flops per token (Kaplan et al. 2020) at `mfu` of the GPU's dense 16-bit peak (`catalog`)."""
    peak = catalog.lookup("gpu", gpu).dense_16bit_tflops * 1e12
    return 6 * n_params * tokens / (peak * mfu)


def nic_GBps(server: str = "DGX H100") -> float:
    """One GPU's network link on a chapter-8 cluster: its NIC, GB/s per direction (`catalog`)."""
    spec = catalog.lookup("server", server)
    if spec.nic_GBps_per_direction is None:
        raise ValueError(f"server={server!r} has no NICs in the catalog; pick e.g. 'DGX H100'")
    return spec.nic_GBps_per_direction


def cluster_dp_seconds(n_params: int, nodes: int, server: str = "DGX H100", bytes_per_value: int = 2
                       ) -> float:
    """Chapter 8's prediction of one gradient all-reduce (two-level ring) on `nodes` servers."""
    from distlab.hardware.cost_model import predict_all_reduce
    from distlab.topology import Cluster
    return float(predict_all_reduce(Cluster(server, nodes), n_params * bytes_per_value))
