"""Chapter 2: data parallelism, from scratch, beside PyTorch's DistributedDataParallel.

One idea per file:
- `sync`: the three gradient-synchronisation strategies (per-parameter all-reduce, bucketed
  all-reduce, bucketed all-reduce overlapped with backward through gradient hooks) and `no_sync`
  (Li et al. 2020, "PyTorch Distributed", VLDB 13(12), sec. 3.2).
- `train`: the training loop (broadcast, replica check, sharded batches, accumulation), the
  single-process reference it must match, and the `Task`s it trains (MLP, small GPT).
- `timeline`: one step as a timeline of backward and all-reduces, measured or predicted.
- `bench`: throughput per strategy and against DDP, over world sizes; `python -m distlab.data_parallel.bench`.
- `figures`: the chapter's figures; `exercises`: the check of the lab's exercise.
"""

from distlab.data_parallel.sync import (
    STRATEGIES,
    BucketedAllReduce,
    OverlappedBucketedAllReduce,
    PerParameterAllReduce,
    all_reduce_bucket,
    make_buckets,
    make_strategy,
)
from distlab.data_parallel.timeline import StepTimeline, predicted_timeline
from distlab.data_parallel.train import (
    Task,
    broadcast_parameters,
    check_batch,
    check_replicas_identical,
    gpt_task,
    mlp_task,
    train_data_parallel,
    train_single_process,
)

__all__ = [
    "STRATEGIES",
    "BucketedAllReduce",
    "OverlappedBucketedAllReduce",
    "PerParameterAllReduce",
    "StepTimeline",
    "Task",
    "all_reduce_bucket",
    "broadcast_parameters",
    "check_batch",
    "check_replicas_identical",
    "gpt_task",
    "make_buckets",
    "make_strategy",
    "mlp_task",
    "predicted_timeline",
    "train_data_parallel",
    "train_single_process",
]
