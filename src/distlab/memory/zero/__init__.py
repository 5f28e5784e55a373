"""ZeRO (Rajbhandari et al. 2020) from scratch: the chapter's sub-package.

- `engine`: `ZeRO(model, stage, group=)`, stages 0-3 with the chapter's own Adam, the readable version.
- `flat`: flat, padded buffers cut into N shards, and Adam on one shard (`ShardAdam`).
- `stage3`: stage 3's schedule, gather a unit before its forward and backward, free it after, prefetch.
- `comm`: the collectives ZeRO calls, each one's bytes recorded in a `CommLog`.
- `accounting`: model-state bytes and communication per rank, the paper's formulas and the measured ones.
- `parity`: ZeRO against one process, on the course's MLP and GPT.
- `exercises`: the check of the lab's ZeRO-2 exercise.
"""

from distlab.memory.zero.engine import ZeRO, check_stage, default_units, dp_group

__all__ = ["ZeRO", "check_stage", "default_units", "dp_group"]
