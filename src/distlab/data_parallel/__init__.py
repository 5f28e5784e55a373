"""Chapter 2: data parallelism, from scratch, beside PyTorch's DistributedDataParallel.

Everything runs in a process group `group=` (None: the whole world; or one dim of a mesh,
`distlab.mesh.grid(dp=2, tp=2)["dp"].get_group()`), and ranks are positions in that group.

One idea per file:
- `buckets`: gradients packed into flat buckets, in backward order, and one bucket's all-reduce.
- `sync`: the three gradient-synchronisation strategies (per-parameter all-reduce, bucketed
  all-reduce, bucketed all-reduce overlapped with backward through gradient hooks) and `no_sync`
  (Li et al. 2020, "PyTorch Distributed", VLDB 13(12), sec. 3.2).
- `train`: the training loop (broadcast, replica check, sharded batches, accumulation), and the
  single-process reference it must match (`distlab.reference` holds the `Task`s it trains: MLP, GPT).
- `powersgd`: PowerSGD (Vogels et al. 2019), fewer bytes per gradient exchange, as a DDP communication
  hook (`PowerSGD`), beside plain all-reduce made the same way; chapters 7 and 11 compare it.
- `parity`: the comparison with the reference (`distlab.parity`), and DP on one dim of a mesh.
- `timeline`: one step as a timeline of backward and all-reduces (measured by `bench`).
- `cost_model`: the alpha-beta predictions: seconds per step, and the predicted timeline.
- `bench`: throughput per strategy and against DDP, over world sizes.
- `figures`: the chapter's figures; `exercises`: the check of the lab's exercise.
- `__main__`: `python -m distlab.data_parallel` (or under torchrun), the benchmark.
"""

from distlab.data_parallel.buckets import all_reduce_bucket, make_buckets
from distlab.data_parallel.cost_model import predict_step_seconds, predicted_timeline
from distlab.data_parallel.parity import parameters_parity, train_on_mesh_dim
from distlab.data_parallel.sync import (
    STRATEGIES,
    BucketedAllReduce,
    OverlappedBucketedAllReduce,
    PerParameterAllReduce,
    make_strategy,
)
from distlab.data_parallel.timeline import StepTimeline
from distlab.data_parallel.train import (
    broadcast_parameters,
    check_batch,
    check_replicas_identical,
    train_data_parallel,
    train_single_process,
)

__all__ = [
    "STRATEGIES",
    "BucketedAllReduce",
    "OverlappedBucketedAllReduce",
    "PerParameterAllReduce",
    "StepTimeline",
    "all_reduce_bucket",
    "broadcast_parameters",
    "check_batch",
    "check_replicas_identical",
    "make_buckets",
    "make_strategy",
    "parameters_parity",
    "predict_step_seconds",
    "predicted_timeline",
    "train_data_parallel",
    "train_on_mesh_dim",
    "train_single_process",
]
