"""Chapter 6: mixture of experts, gating, and expert parallelism.

`ExpertParallelMoE` and the parity and traffic runs take `group=` (the expert-parallel process group,
e.g. `mesh["ep"].get_group()`; None = the whole world, or one process without torch.distributed).
One idea per file:
- `gating`: the router, top-k gating (Switch k = 1, GShard k = 2, noisy top-k), expert capacity,
  dropping in a fixed priority order, the load-balancing loss and the router z-loss.
- `layer`: the single-process MoE layer, the reference (capacity counted per GShard group).
- `expert_parallel`: experts split over the ranks of a group; dispatch and combine with two all-to-alls
  of variable split sizes (`dist.all_to_all_single`), differentiable through `AllToAll`.
- `cost_model`: parameters against FLOPs per token, and the all-to-alls' predicted bytes and time.
- `parity`: parity of the parallel layer with the reference, run on every rank, and its verdict.
- `traffic`: the bytes the all-to-alls carry in a few training steps, measured from the split sizes.
- `load_balance`: skewed synthetic tokens, drop rate against capacity, a short training run with and
  without the balancing loss; `figures`: the pictures and the explorer drawn from them.
- At scale: `dropless` (no capacity, grouped products over expert-sorted rows, MegaBlocks), `node_limited`
  (each token's experts on at most M nodes, DeepSeek-V3), `hierarchical` (the all-to-all as an inter-node
  and an intra-node step) and its `hierarchical_parity`, `aux_free` (the per-expert selection bias of
  Wang et al. 2024), `dispatch_cost` (when hierarchical dispatch pays on chapter 8's clusters) and
  `scale_figures`.
- Expert layouts: `folding` (parallel folding, Liu et al. 2025: attention on tp x dp and experts on ep x
  edp over the same ranks, two DeviceMeshes unflattened from one), `folded_block` (a block with
  tensor-parallel attention and expert-parallel experts, its single-process reference, and the gradient
  reduction over dp, tp and edp), `folding_parity` (its parity with one process, run on every rank),
  `published_runs` (published MoE runs as data, each row with its source) and `published_counts` (their
  parameters, experts per rank and where each expert-parallel group lies).
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
