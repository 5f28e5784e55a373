"""Chapter 9's checkpoints: sharded save and load with torch.distributed.checkpoint (DCP), resharding to
another (dp, pp, tp), refusing a damaged checkpoint, and restarting a job that lost a rank.

One idea per file:
- `contract`: `ShardedParam` (a local parameter's dense name, tensor, tp dim, c_attn's 3 chunks, the tied
  copy) and `Checkpointable`, what a trainer offers (`parallel3d.train.Trainer3D`, `train.Trainer`).
- `store`: `save` and `load` (each pipeline stage writes its own keys as DTensors on its (dp, tp)
  sub-mesh; loadable on another mesh), `latest` and `step_dir`.
- `verify`: a missing, truncated or damaged checkpoint, or another model's (a key missing or extra,
  another shape or dtype), refused by name before anything loads; `errors`: `CheckpointError`, and DCP's
  own errors turned into it; `checksums`: the CRC-32 of every chunk, written at save.
- `zero_state`: ZeRO's flat Adam state to and from one tensor per parameter; `sharded_state`: the same
  for chapter 7's `ShardedOptimizer`, through its state dicts (resumable on another dp size).
- `train`: a small dp x tp trainer (chapter 5's ParallelGPT, chapter 7's ZeRO engine or
  `ShardedOptimizer`) and its single-process
  reference, the lab's example; `parity`: resume on other meshes, and the verdict.
- `cost_model`: steps lost and the checkpoint interval (Young 1974, Daly 2006); `figures`, `exercises`:
  the lab's figure and check.
The script torchrun restarts is `distlab.parallel3d.restart`.
"""

from distlab.parallel3d.checkpoint.contract import Checkpointable, ShardedParam
from distlab.parallel3d.checkpoint.errors import CheckpointError
from distlab.parallel3d.checkpoint.store import (
    latest,
    load,
    save,
    stage_mesh,
    state_dict,
    step_dir,
    to_dtensor,
)
from distlab.parallel3d.checkpoint.verify import verify

__all__ = [
    "CheckpointError",
    "Checkpointable",
    "ShardedParam",
    "latest",
    "load",
    "save",
    "stage_mesh",
    "state_dict",
    "step_dir",
    "to_dtensor",
    "verify",
]
