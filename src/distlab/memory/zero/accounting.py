"""ZeRO's memory and communication formulas (Rajbhandari et al. 2020, sec. 3.1, 5 and 7), and the same
quantities measured on a running `zero.ZeRO`.

Memory. Mixed-precision Adam keeps, per parameter, 2 bytes of fp16 parameter, 2 of fp16 gradient and
K = 12 of optimizer state (fp32 master parameter, momentum and variance): (2 + 2 + K) Psi bytes on every
data-parallel rank. With N ranks, stage 1 divides the K Psi by N, stage 2 also the gradients' 2 Psi, and
stage 3 also the parameters' 2 Psi (the paper's Figure 1):

    stage 0: (2 + 2 + K) Psi      stage 1: (2 + 2) Psi + K Psi / N
    stage 2: 2 Psi + (2 + K) Psi / N      stage 3: (2 + 2 + K) Psi / N

This course's CPU labs train in fp32, with no separate master copy (the fp32 parameters are the master),
so the same formulas hold with 4 bytes of parameter, 4 of gradient and K = 8 (Adam's two fp32 moments):
16 Psi for plain DP. `model_state_bytes` evaluates either; `measured_model_state_bytes` sums the bytes of
the tensors a `ZeRO` engine actually holds.

Communication, per rank and step, with ring collectives on buffers of Psi values (sec. 7.2): plain DP's
all-reduce is a reduce-scatter plus an all-gather, 2 (N - 1)/N Psi values sent; stages 1 and 2 do one
reduce-scatter of the gradients and one all-gather of the parameters, the same 2 (N - 1)/N Psi; stage 3
all-gathers the parameters twice (forward and backward) and reduce-scatters the gradients once, 3 (N - 1)/N
Psi: 1.5x. The paper rounds (N - 1)/N to 1 and writes 2 Psi and 3 Psi. `comm_sent_bytes` is the formula;
`zero_sent_bytes` sums the same from a `distlab.comm_log` opened around a step, each call's bytes by the
ring factors of `distlab.comm_log.ring_bytes`, without ZeRO's control messages.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from distlab.comm_log import CommLog
from distlab.memory.estimate import cost_model
from distlab.memory.zero.uneven import CONTROL

MIXED = {"param_bytes": 2, "grad_bytes": 2, "k": 12}  # the paper's fp16/fp32 mixed-precision Adam
FP32 = {"param_bytes": 4, "grad_bytes": 4, "k": 8}  # fp32 Adam: the parameters are the master copy

# Collectives per step, in units of "one ring pass over the whole Psi" (all-reduce = 2 passes).
PASSES_PER_STEP = {0: 2, 1: 2, 2: 2, 3: 3}


def model_state_bytes(psi: int, n: int, stage: int, *, param_bytes: int = 2, grad_bytes: int = 2,
                      k: int = 12) -> dict[str, float]:
    """Per-rank bytes of parameters, gradients and optimizer state for `psi` parameters on `n` ranks
    (Rajbhandari et al. 2020, sec. 5, Figure 1), and their total: `cost_model.model_state_bytes` by
    name. Defaults: mixed precision; pass `**FP32` for fp32 Adam."""
    if stage not in PASSES_PER_STEP:
        raise ValueError(f"stage={stage!r} is not a ZeRO stage; choose 0, 1, 2 or 3")
    if n < 1:
        raise ValueError(f"n={n!r} must be at least 1 (the data-parallel degree N_d)")
    w, g, o = cost_model.model_state_bytes(psi, (param_bytes, grad_bytes, k), stage, n)
    return {"parameters": float(w), "gradients": float(g), "optimizer": float(o), "total": float(w + g + o)}


def comm_sent_bytes(psi: int, n: int, stage: int, bytes_per_value: int = 4) -> int:
    """Bytes one rank sends per step with ring collectives: passes x (N - 1)/N x Psi x bytes, where
    passes is 2 (stages 0-2) or 3 (stage 3). `psi` must be a multiple of `n` (use the padded count)."""
    if psi % n:
        raise ValueError(f"psi={psi} is not a multiple of n={n}; pass the padded count, "
                         "ZeRO.parameter_count(padded=True)")
    return PASSES_PER_STEP[stage] * (n - 1) * psi * bytes_per_value // n


def comm_ratio_to_dp(stage: int) -> float:
    """Stage `stage`'s communication volume over plain data parallelism's: 1.0, or 1.5 for stage 3."""
    return PASSES_PER_STEP[stage] / PASSES_PER_STEP[0]


def zero_sent_bytes(log: CommLog, op: str | None = None) -> int:
    """The bytes this rank sent in the calls `log` recorded (all, or those of `op`) with the ring
    algorithms, leaving out ZeRO's control messages (labelled `uneven.CONTROL`): the volume the paper
    counts. ZeRO pads every buffer to a multiple of N, so the sum is a whole number of bytes; it is rounded
    to one, since the factors (N - 1)/N are floats."""
    return round(sum(r.sent_bytes for r in log.select(op=op) if CONTROL not in r.where.split("/")))


def _storage_bytes(tensors: list[Tensor | None], seen: set[int]) -> int:
    """Bytes of the storages behind `tensors`, each storage counted once over all calls sharing `seen`."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def measured_model_state_bytes(engine: Any) -> dict[str, int]:
    """The bytes the `ZeRO` engine holds on this rank now, by kind: parameters (the full flat buffers
    where allocated, stage 3's shards), gradients (whole or shard), optimizer (Adam's moments), host
    (what `offload=True` keeps on the host), and the device total. Each storage is counted once."""
    seen: set[int] = set()
    params = _storage_bytes([u.flat for u in engine.units] + [u.shard for u in engine.units], seen)
    grads = _storage_bytes([u.grad_full for u in engine.units] + [u.grad_shard for u in engine.units], seen)
    optim = _storage_bytes([t for u in engine.units for t in u.adam.state_tensors()], seen)
    host = _storage_bytes([t for u in engine.units if u.host is not None for t in u.host.tensors()], seen)
    return {"parameters": params, "gradients": grads, "optimizer": optim, "host": host,
            "total": params + grads + optim}
