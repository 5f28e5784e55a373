"""HSDP and the healing replicas against one process (`distlab.reference`), in `distlab.parity`'s words.

`train_hsdp` runs inside the ranks: HSDP(R, S) on `grid(dp_replicate=R, dp_shard=S)`, each rank on its
slice of every global batch (rank r*S + s takes slice r*S + s of R*S: `Task.shard_backward`), the
course's SGD with momentum; it returns the losses (averaged over all ranks, `reference.group_mean`), the
whole parameters after the last step and the bytes `comm_log` counted in each axis during one step.
`reference_run` trains the same task on one process.
`survivors_reference` is what the run with a killed replica must equal: one process whose batch at each
step is the union of the slices of the replicas in that step's quorum (`replicas.ReplicaLog.members`).

Tolerance: fp32 (`parity.TOLERANCE[torch.float32]`). The averaged gradient is the same sum as one
process's in another order (per rank, across the shard group, across replicas): rounding only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from distlab import parity, reference, sharding
from distlab.comm_log import comm_log
from distlab.fault_tolerance.hsdp import REPLICATE, SHARD, hsdp, replica_all_reduce_
from distlab.memory.zero import fsdp
from distlab.mesh import grid

LR, MOMENTUM = 0.05, 0.9


def train_hsdp(task: reference.Task, replicate: int, shard: int, steps: int, global_batch: int,
               seed: int = 0) -> dict:
    """HSDP(R=`replicate`, S=`shard`) for `steps` steps on this rank (call on every rank of R x S)."""
    mesh = grid(dp_replicate=replicate, dp_shard=shard)
    world, rank = dist.get_world_size(), dist.get_rank()
    model = hsdp(task.build(seed), mesh)
    optimizer = reference.SGD(model.parameters(), LR, momentum=MOMENTUM)
    losses, step_bytes = [], {}
    for step in range(steps):
        x, y = task.batch(step, global_batch, seed)
        optimizer.zero_grad()
        with comm_log(mesh=mesh) as log:
            loss = task.shard_backward(model, x, y, rank, world)
            replica_all_reduce_(model, mesh[REPLICATE].get_group())
        optimizer.step()
        if step == 0:
            step_bytes = {"shard_B": log.bytes(axis=SHARD, op=("all_gather", "reduce_scatter")),
                          "replicate_B": log.bytes(axis=REPLICATE, op="all_reduce"),
                          "shard_sent": log.sent_bytes(axis=SHARD, op=("all_gather", "reduce_scatter")),
                          "replicate_sent": log.sent_bytes(axis=REPLICATE, op="all_reduce")}
        losses.append(reference.group_mean(loss))
    return {"losses": losses, "params": fsdp.full_parameters(model), "bytes": step_bytes,
            "units": [[tuple(w.shape) for w in u.full] for u in fsdp._units(model)]}


def reference_run(task: reference.Task, steps: int, global_batch: int, seed: int = 0
                  ) -> reference.ReferenceRun:
    """One process, the whole global batch at every step, the same SGD."""
    model = task.build(seed)
    return reference.train_reference(model, task.batches(steps, global_batch, seed), task.loss,
                                     reference.SGD(model.parameters(), LR, momentum=MOMENTUM))


def hsdp_report(result: dict, ref: reference.ReferenceRun, label: str) -> parity.ParityReport:
    """Losses and final parameters of one HSDP run against one process."""
    return parity.compare({"losses": result["losses"], "parameters": result["params"]},
                          {"losses": ref.losses, "parameters": ref.params},
                          dtype=torch.float32, label=label, against="one process")


def survivors_batches(task: reference.Task, members: list[tuple[int, ...]], per_replica: int,
                      replicas: int, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    """Step t's batch of the run with failures: the rows of the replicas in step t's quorum, replica i's
    rows being slice i of the `replicas` x `per_replica` global batch every replica draws."""
    out = []
    for step, quorum in enumerate(members):
        x, y = task.batch(step, replicas * per_replica, seed)
        rows = [sharding.shard(len(x), i, replicas) for i in sorted(quorum)]
        out.append((torch.cat([x[r] for r in rows]), torch.cat([y[r] for r in rows])))
    return out


def survivors_reference(task: reference.Task, members: list[tuple[int, ...]], per_replica: int,
                        replicas: int, seed: int = 0) -> reference.ReferenceRun:
    """One process trained on `survivors_batches`: what a run whose quorums were `members` must equal
    (the average of equal-sized slices' mean losses is the mean loss of their union)."""
    model = task.build(seed)
    return reference.train_reference(model, survivors_batches(task, members, per_replica, replicas, seed),
                                     task.loss, reference.SGD(model.parameters(), LR, momentum=MOMENTUM))
