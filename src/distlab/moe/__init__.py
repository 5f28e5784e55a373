"""Chapter 6: mixture of experts, gating, and expert parallelism.

One idea per file:
- `gating`: the router, top-k gating (Switch k = 1, GShard k = 2, noisy top-k), expert capacity,
  dropping in a fixed priority order, the load-balancing loss and the router z-loss.
- `layer`: the single-process MoE layer, the reference (capacity counted per GShard group).
- `expert_parallel`: experts split over ranks; dispatch and combine with two all-to-alls of variable
  split sizes (`dist.all_to_all_single`), differentiable through `AllToAll`.
- `cost`: parameters against FLOPs per token, and the all-to-alls' predicted bytes and time.
- `check`: parity of the parallel layer with the reference, run on every rank.
- `explore`: skewed synthetic tokens, drop rate against capacity, a short training run with and
  without the balancing loss; `figures`: the pictures and the explorer drawn from them.
- `exercises`: the checks of the lab's exercises. `python -m distlab.moe` runs the parity check and
  reports the all-to-all traffic, on this machine or under torchrun.
"""

from distlab.moe.expert_parallel import AllToAll, ExpertParallelMoE, all_to_all
from distlab.moe.gating import (
    Router,
    Routing,
    check_moe_config,
    expert_capacity,
    load_balancing_loss,
    router_z_loss,
    top_k_gating,
)
from distlab.moe.layer import ExpertFFN, MoELayer, MoEOutput

__all__ = [
    "AllToAll",
    "ExpertFFN",
    "ExpertParallelMoE",
    "MoELayer",
    "MoEOutput",
    "Router",
    "Routing",
    "all_to_all",
    "check_moe_config",
    "expert_capacity",
    "load_balancing_loss",
    "router_z_loss",
    "top_k_gating",
]
