"""Chapter 11: training that survives failures and slow links.

HSDP on the mesh, replica groups that agree on a quorum every step and heal from a live peer, and the
methods that communicate every H steps instead of every step (local SGD, DiLoCo, streaming DiLoCo),
checked against torchft.

Parts 1-2, one idea per file:
- `hsdp`: `hsdp(model, mesh)` (chapter 7's `fully_shard` over the mesh's dp_shard axis) and
  `replica_all_reduce_` (the gradient average across replica groups, over dp_replicate).
- `cost_model`: HSDP's bytes inside a replica group and across, memory, and time on a chapter-8 cluster
  against ZeRO-3 over all ranks.
- `quorum`: heartbeats, a quorum per round through a key-value store, and one decision per round.
- `heal`: a fresh gloo group per quorum, and the training state sent point-to-point to a replica behind.
- `replicas`: the data-parallel trainer that uses both (`run_replicas`, with a killed and a joining slot).
- `scripted`: the faults a run of `replicas` scripts (a kill, a join, a pause), at the same step on every run.
- `goodput`: useful steps per hour under failures, checkpoint-restart (Young, Daly) against healing.
- `parity`: HSDP and the healing run against one process (`distlab.reference`).
- `figures`: the pictures and the goodput explorer of parts 1-2.

Parts 3-4, communicating less and against torchft:
- `local_sgd`: `LocalSGD`, average the parameters every H steps (and the checks of H and the outer lr).
- `diloco`: `DiLoCo`, H inner steps, the averaged pseudo-gradient, an outer Nesterov step (`OuterSync`).
- `streaming`: `StreamingDiLoCo`, K fragments synchronised at staggered steps, optionally in bfloat16.
- `replica_loop`: `Recipe`; every method on ranks (`on_ranks`) and as a loop in one process (`simulate`).
- `powersgd_run`: chapter 7's PowerSGD on the same task, for comparison (`powersgd_ddp`, the model in DDP
  with its hook; `replica_loop.on_ranks` trains it).
- `bandwidth`: bytes per step, step time, and the break-even link speed L*.
- `torchft_compare`: torchft's own `LocalSGD` / `DiLoCo` on the same seed (`GroupManager`).
- `quorum_kill`: torchft's `Manager` and lighthouse with one replica SIGKILLed.
- `curves`: the loss curves of part 3 and the break-even figure.
"""

from distlab.fault_tolerance.diloco import DiLoCo, OuterNesterov, OuterSync
from distlab.fault_tolerance.local_sgd import LocalSGD
from distlab.fault_tolerance.streaming import StreamingDiLoCo, layer_fragments

__all__ = ["DiLoCo", "LocalSGD", "OuterNesterov", "OuterSync", "StreamingDiLoCo", "layer_fragments"]
