"""What the all-to-alls of expert parallelism carry, measured on every rank and set beside the prediction.

`measure_traffic` runs a few training steps of an `ExpertParallelMoE` on this rank's skewed tokens
(`explore.skewed_tokens`) inside a `distlab.comm_log`, and reads off, per step, the bytes that left the
rank in the forward pass's dispatch all-to-all and in its combine all-to-all (the layer labels them
"dispatch" and "combine"; a rank's chunk to itself never leaves it). The combine all-to-all sends back
exactly what dispatch received, and the backward pass repeats both in reverse
(`expert_parallel.AllToAll`). `cost_model.predict_all_to_all` gives the balanced-routing prediction, and
the time of each step is measured between barriers. It runs on the ranks of `group` (None = the whole
world), in `dtype` (float64 makes the routing, and so the bytes, the same on every machine: a float32
logit can land on the other side of a near-tie on another CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from distlab.comm_log import comm_log
from distlab.mesh import group_rank, group_size
from distlab.moe.cost_model import predict_all_to_all
from distlab.moe.expert_parallel import ExpertParallelMoE
from distlab.moe.load_balance import skewed_tokens
from distlab.timing import cuda_sync, sample_seconds


@dataclass
class TrafficRow:
    """One step on one rank: bytes sent to other ranks by dispatch (and by combine), dropped share, and
    the step's wall time (forward + backward, slowest rank not yet taken)."""

    step: int
    dispatch_bytes: int
    combine_bytes: int
    predicted_bytes: float
    dropped: float
    seconds: float


def measure_traffic(tokens_per_rank: int = 256, d_model: int = 64, d_hidden: int = 128,
                    num_experts: int = 8, k: int = 2, capacity_factor: float = 1.25, skew: float = 0.0,
                    steps: int = 5, seed: int = 0, dtype: torch.dtype = torch.float32,
                    group: dist.ProcessGroup | None = None) -> list[TrafficRow]:
    """Run `steps` forward+backward passes of one expert-parallel layer on this rank of `group`."""
    r, p = group_rank(group), group_size(group)
    nccl = dist.is_initialized() and dist.get_backend(group) == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    torch.manual_seed(seed)  # the same router on every rank
    layer = ExpertParallelMoE(d_model, d_hidden, num_experts, k, capacity_factor, group=group)
    layer = layer.to(device=dev, dtype=dtype)
    element = torch.finfo(dtype).bits // 8
    predicted = predict_all_to_all(tokens_per_rank, d_model, k, p, element).bytes_per_all_to_all
    rows = []
    for step in range(steps):
        x = skewed_tokens(tokens_per_rank, d_model, skew, seed=1000 * (step + 1) + r).to(dev, dtype)
        with comm_log() as log:  # counted apart from the timed pass: a log sends every op through Python
            out = layer(x)
            out.y.square().mean().backward()
        layer.zero_grad()
        # the same step again (no optimizer step in between), timed once, started after a barrier
        seconds = sample_seconds(lambda x=x: layer(x).y.square().mean().backward(), 1, warmup=0, group=group,
                                 barrier=True, sync=cuda_sync(dev), after=layer.zero_grad)[0]
        dispatch, combine = (int(log.sent_bytes(op="all_to_all", where=w, phase="forward"))
                             for w in ("dispatch", "combine"))
        rows.append(TrafficRow(step, dispatch, combine, predicted, out.routing.dropped_fraction(), seconds))
    return rows
