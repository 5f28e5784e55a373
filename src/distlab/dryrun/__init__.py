"""Chapter 12: dry runs at scale. One rank of a published layout of thousands of GPUs, run on a laptop.

Torch's fake process group makes this process rank r of n ranks (collectives return at once, send
nothing); the meta device gives tensors shapes but no storage. Chapter 9's 3D trainer (with chapter 7's
ZeRO) then runs one step of a published model as that rank, and what its code calls and holds is
recorded, not predicted. One idea per file:

- `fake_world`: `fake_world(rank, world_size)`, the fake process group for the length of a block;
- `layouts`: `DryLayout` and `from_published(name, layers=, microbatches=)`, a row of
  `distlab.plan.published` as a `GPTConfig`, a `Plan3D` and a batch; `estimator_config`, the same layout
  for chapter 7's estimator;
- `attention`: `FusedAttentionOnMeta`, attention on the meta device as the fused kernel of a real run
  computes it (saving a log-sum-exp, not the s x s probabilities of the math path, `attention="math"`);
- `held`: the bytes one rank holds (parameters, gradients, Adam's state) counted by storage identity, which
  works on meta tensors;
- `run`: `dry_run(layout, rank)`, one step as one rank: its calls per axis (`distlab.comm_log`), chapter
  9's transfers and the memory it held (activations: the executor's peak of saved tensors);
- `cost_model`: `predicted(layout, rank)` from chapter 9's traffic model and chapter 7's estimator, and
  `agreement`, measured beside predicted;
- `parity`: `small_world_check`, the same step on a few real ranks equal to one process, and the dry run
  equal to the real run call for call;
- `moe_rank`: a DeepSeek-V3-shaped rank: `stage_modules` (one rank's stage of a published MoE layout on the
  meta device) and `moe_layer_step` (one MoE layer's all-to-alls and saved tensors on the fake world);
- `moe_layer`: `whole_layer_step`, a whole MoE layer (MLA or grouped-query attention, then the MoE half);
- `moe_step`: `stage_step`, one rank's whole 1F1B step of its pipeline stage: its messages, all-to-alls,
  model states and the peak it holds, against chapter 9's traffic and chapter 7's `moe_stage_peaks`;
- `moe_savings_step`: DeepSeek-V3's savings run on meta (FP8 caching as saved-tensor hooks, recomputation
  as checkpoints);
- `moe_report`: `moe_dry_run` and `moe_report`, a judged MoE rank beside the models (`--moe-published`);
- `report`: the tables the command line and the lab print;
- `__main__`: `python -m distlab.dryrun --published llama3-405b-16k --rank 5`, or `--moe-published
  deepseek-v3 --rank 130 --savings recompute,fp8`.
"""

from distlab.dryrun.cost_model import Agreement, Prediction, agreement, predicted
from distlab.dryrun.fake_world import fake_world
from distlab.dryrun.held import HeldBytes
from distlab.dryrun.layouts import DryLayout, dry_run_names, estimator_config, from_published
from distlab.dryrun.run import AxisCalls, DryRun, dry_run

__all__ = ["Agreement", "AxisCalls", "DryLayout", "DryRun", "HeldBytes", "Prediction", "agreement",
           "dry_run", "dry_run_names", "estimator_config", "fake_world", "from_published", "predicted"]
