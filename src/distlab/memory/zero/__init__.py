"""ZeRO (Rajbhandari et al. 2020) from scratch: the chapter's sub-package.

- `engine`: `ZeRO(model, stage, group=)`, stages 0-3 with the chapter's own Adam, the readable version;
  `units`: how it cuts the model into units (`default_units`) and each unit's buffers per stage.
- `optimizer`: `ShardedOptimizer(params, torch.optim.AdamW, group=, stage=1|2, lr=...)`, stages 1-2
  around any element-wise torch optimizer, with parameter groups, visible gradients and clipping;
  `reduce`: its gradient reduction (`GradientReducer`), each bucket reduce-scattered from backward hooks.
- `fsdp`: `fully_shard(module, group=, mp_policy=)`, stage 3 per module as FSDP2 does it, after which
  any optimizer takes `model.parameters()`; `clip_grad_norm_`, `full_parameters` and the optimizer's
  state for such a model. `fsdp_unit`: one sharded module and its hooks around forward and backward.
- `buckets`: per-parameter slices packed rank-major, so one collective moves many parameters.
- `clip`: gradient clipping by the global norm over shards; `state_dict`: whole and sharded optimizer
  state, loadable on another number of ranks.
- `flat`: flat, padded buffers cut into N shards, and Adam on one shard (`ShardAdam`).
- `stage3`: stage 3's schedule, gather a unit before its forward and backward, free it after, prefetch.
- `order`: stage 3's rule that every rank runs the same units in the same order (a clear error, not a
  hang); `uneven`: the same for which parameters got a gradient. Both send control messages, labelled
  `uneven.CONTROL` in `distlab.comm_log` and left out of the paper's volume.
- `accounting`: model-state bytes and communication per rank, the paper's formulas and the measured ones
  (`zero_sent_bytes`: a `distlab.comm_log` opened around a step, summed with the ring factors). ZeRO's
  code only labels its collectives (`comm_log.where`); whoever wants the bytes opens the log.
- `parity`: ZeRO against one process (`distlab.reference`), on the course's MLP and GPT (`zero_task`).
- `exercises`: the check of the lab's ZeRO-2 exercise; `validate`: the checks of stage, group and mesh.
- `offload`: ZeRO-Offload (Ren et al. 2021), the optimizer's state and step on the host (`HostShard`,
  which the engine's units keep), activations offloaded to the host, and the transfer model.
"""

from distlab.memory.zero.engine import ZeRO, check_stage, default_units, dp_group
from distlab.memory.zero.optimizer import ShardedOptimizer
from distlab.memory.zero.state_dict import merge_sharded

__all__ = ["ShardedOptimizer", "ZeRO", "check_stage", "default_units", "dp_group", "merge_sharded"]
