"""ZeRO (Rajbhandari et al. 2020) from scratch: the chapter's sub-package.

- `engine`: `ZeRO(model, stage, group=)`, stages 0-3 with the chapter's own Adam, the readable version.
- `optimizer`: `ShardedOptimizer(params, torch.optim.AdamW, group=, stage=1|2, lr=...)`, stages 1-2
  around any element-wise torch optimizer, with parameter groups, visible gradients and clipping.
- `fsdp`: `fully_shard(module, group=, mp_policy=)`, stage 3 per module as FSDP2 does it, after which
  any optimizer takes `model.parameters()`; `clip_grad_norm_` and `full_parameters` for such a model.
- `buckets`: per-parameter slices packed rank-major, so one collective moves many parameters.
- `clip`: gradient clipping by the global norm over shards; `state_dict`: whole and sharded optimizer
  state, loadable on another number of ranks.
- `flat`: flat, padded buffers cut into N shards, and Adam on one shard (`ShardAdam`).
- `stage3`: stage 3's schedule, gather a unit before its forward and backward, free it after, prefetch.
- `comm`: the collectives ZeRO calls, each one's bytes recorded in a `CommLog`.
- `accounting`: model-state bytes and communication per rank, the paper's formulas and the measured ones.
- `parity`: ZeRO against one process, on the course's MLP and GPT.
- `exercises`: the check of the lab's ZeRO-2 exercise; `validate`: the checks of stage, group and mesh.
"""

from distlab.memory.zero.engine import ZeRO, check_stage, default_units, dp_group
from distlab.memory.zero.optimizer import ShardedOptimizer
from distlab.memory.zero.state_dict import merge_sharded

__all__ = ["ShardedOptimizer", "ZeRO", "check_stage", "default_units", "dp_group", "merge_sharded"]
