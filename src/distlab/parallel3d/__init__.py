"""Chapter 9: putting it together. The course's GPT trained with data, pipeline and tensor parallelism
on one DeviceMesh (Narayanan et al. 2021, PTD-P), built from the chapters, not copied.

One idea per file:
- `config`: `Plan3D` (dp, pp, tp, micro-batches, schedule, ZeRO stage, sequence parallelism) and
  `check_plan`, the errors that name the parameter, its value and the fix; `block_ranges`, the uneven split.
- `model`: this rank's pipeline stage and tensor-parallel shard of the dense GPT (`build_stage`), under
  the dense names, and `named_shards` -> `checkpoint.ShardedParam`s, the checkpoint contract.
- `train`: `Trainer3D`, one rank of the run a step at a time on a `distlab.mesh.grid(dp=, pp=, tp=)`:
  chapter 4's executor, chapter 5's layers and loss, chapter 7's ZeRO; checkpointable (save at step k,
  load on another (dp, pp, tp), go on); `train_3d`, its loop over a list of batches; `make_batches`.
- `parity`: the single-process reference (`reference_run`) and `parity_3d`, a `distlab.parity` report.
- `traffic`: the bytes of a step recorded from its calls, per dim; `cost_model`: the same from the shapes.
- `placement`: the mesh put on a chapter-8 cluster, TP inside a node or across, and the predicted time.
- `figures`: the mesh and the placement pictures; `exercises`: the lab's checks.
- `__main__`: `python -m distlab.parallel3d --dp 2 --pp 2 --tp 1` runs a few steps and checks parity.
Checkpoints, restarts and many nodes:
- `checkpoint/`, a sub-package: the one contract (`ShardedParam`: dense name, local tensor, tp dim,
  c_attn's 3 chunks, the tied copy; `Checkpointable`, which `Trainer3D` and the dp x tp
  `checkpoint.train.Trainer` both are); sharded save/load with torch.distributed.checkpoint, each
  pipeline stage writing its own keys as DTensors on its (dp, tp) sub-mesh, loadable on another
  (dp, pp, tp) (resharding); a CRC-32 per chunk, and a damaged, partial or mismatched checkpoint refused
  by name before anything loads; ZeRO's flat Adam state per parameter; the lab's small trainer, parity,
  cost model (Young 1974, Daly 2006), figure and check (its `__init__` maps its files).
- `restart`: the script torchrun restarts (`--max-restarts`): `Trainer3D` on `--dp --pp --tp`, with
  fault injection (`--kill-at-step`);
  `multinode`: torchrun and sbatch commands, and several torchrun agents on one machine as "nodes".
The planner that chooses dp, pp, tp, cp and ZeRO for a cluster is its own package, `distlab.plan`.
"""

from distlab.parallel3d.checkpoint import ShardedParam
from distlab.parallel3d.config import Plan3D, block_ranges, check_plan
from distlab.parallel3d.cost_model import Transfer, bytes_by_axis, predicted_traffic
from distlab.parallel3d.model import StageModel, build_stage, named_shards
from distlab.parallel3d.parity import parity_3d, reference_run
from distlab.parallel3d.train import RankRun3D, Trainer3D, make_batches, train_3d

# the older name, which tests/parallel3d/checkpoint/test_parallel3d_checkpoint_3d.py imports
compare = parity_3d

__all__ = [
    "Plan3D",
    "RankRun3D",
    "ShardedParam",
    "StageModel",
    "Trainer3D",
    "Transfer",
    "block_ranges",
    "build_stage",
    "bytes_by_axis",
    "check_plan",
    "compare",
    "make_batches",
    "named_shards",
    "parity_3d",
    "predicted_traffic",
    "reference_run",
    "train_3d",
]
