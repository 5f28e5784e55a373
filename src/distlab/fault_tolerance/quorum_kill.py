"""Section 4's failure experiment: torchft's `Manager` and lighthouse with one replica killed mid-step.

R replica groups of one rank each (distlab.launch ranks, the victim in `may_fail`) train a small MLP
with torchft's fault-tolerant loop: every step starts a quorum at the lighthouse (`start_quorum`), all-
reduces the gradients through the `Manager` (which averages over the replicas in the quorum) and takes
the optimizer step only if every participant's collectives succeeded (`should_commit`). At step
`kill_at` the victim SIGKILLs itself after its backward pass, before its all-reduce. The survivors'
all-reduce fails, they do not commit that step, and their next quorum leaves the victim out once the
lighthouse has missed its heartbeats; they then train on with R - 1 replicas.

What each survivor records per step: when it started and ended, the manager's step, the participants,
whether it committed. `summarise` turns that into steps lost (attempts not committed), the time from the
kill to the first step committed without the victim (time to recover), and the participants before and
after. (torchft: Meta, "torchft: fault tolerance for PyTorch", github.com/pytorch/torchft, 0.2.0.)
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import torch.distributed as dist

from distlab.reference import SGD, mlp_task


@dataclass(frozen=True)
class StepRecord:
    start: float
    end: float
    step: int
    participants: int
    committed: bool


def replica(lighthouse: str, kill_at: int, victim: int, steps: int, kill_file: str,
            timeout_s: float = 5.0) -> list[StepRecord]:
    """Inside a rank: one replica group of torchft, trained until the manager's step reaches `steps`."""
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo
    logging.getLogger("torchft").setLevel(logging.CRITICAL)  # the expected failure, not a traceback
    me = dist.get_rank()
    task = mlp_task(sizes=(8, 16, 4), n=96)
    model = task.build(0)
    opt = SGD(model.parameters(), 0.05)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=timeout_s)),
                      load_state_dict=model.load_state_dict, state_dict=model.state_dict,
                      min_replica_size=2, use_async_quorum=False, timeout=timedelta(seconds=timeout_s),
                      quorum_timeout=timedelta(seconds=30), connect_timeout=timedelta(seconds=10),
                      rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
                      lighthouse_addr=lighthouse, replica_id=f"replica{me}", hostname="127.0.0.1",
                      init_sync=False)
    dist.barrier()  # every replica has its manager before the first quorum
    records, attempt = [], 0
    try:
        while manager.current_step() < steps:
            start = time.time()
            manager.start_quorum()
            x, y = task.batch(attempt, 12, 0)
            opt.zero_grad()
            task.shard_backward(model, x, y, me % 3, 3)
            if me == victim and manager.current_step() == kill_at:
                Path(kill_file).write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            for p in model.parameters():
                manager.allreduce(p.grad).wait()
            committed = manager.should_commit()
            if committed:
                opt.step()
            records.append(StepRecord(start, time.time(), manager.current_step(), manager.num_participants(),
                                      committed))
            attempt += 1
    finally:
        manager.shutdown(wait=False)
    return records


@dataclass(frozen=True)
class QuorumReport:
    """What one survivor saw: attempts not committed, seconds from the kill to the first commit without
    the victim, participants before and after, and the final step."""

    steps_lost: int
    seconds_to_recover: float
    participants_before: int
    participants_after: int
    final_step: int


def summarise(records: list[StepRecord], killed_at: float) -> QuorumReport:
    before = [r for r in records if r.end < killed_at and r.committed]
    after = [r for r in records if r.end >= killed_at and r.committed]
    if not before or not after:
        raise ValueError("the run has no committed step before or after the kill; raise steps or kill_at")
    return QuorumReport(sum(not r.committed for r in records), after[0].end - killed_at,
                        before[-1].participants, after[0].participants, records[-1].step)


def torchft_kill_experiment(replicas: int = 3, kill_at: int = 3, steps: int = 8, victim: int | None = None,
                            heartbeat_timeout_ms: int = 1000) -> list[QuorumReport]:
    """Start a lighthouse on 127.0.0.1, run `replicas` replica groups, SIGKILL one at step `kill_at`, and
    summarise each survivor's view. Everything started is gone when it returns."""
    import tempfile

    from distlab import launch
    if replicas < 3:
        raise ValueError(f"replicas={replicas} leaves fewer than the quorum's minimum of 2 after the kill; "
                         "use replicas=3 or more")
    victim = replicas - 1 if victim is None else victim
    os.environ.setdefault("RUST_LOG", "error")  # torchft's Rust side logs every quorum at INFO otherwise
    from torchft.coordination import LighthouseServer
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=2000,
                                  quorum_tick_ms=50, heartbeat_timeout_ms=heartbeat_timeout_ms)
    try:
        with tempfile.TemporaryDirectory(prefix="distlab-torchft-") as tmp:
            kill_file = str(Path(tmp) / "killed_at")
            address = f"http://127.0.0.1:{urlparse(lighthouse.address()).port}"  # it names the host
            runs = launch.run(replica, replicas, address, kill_at, victim, steps, kill_file,
                              may_fail={victim}, timeout=60.0, deadline=180.0)
            killed_at = float(Path(kill_file).read_text())
    finally:
        lighthouse.shutdown()
    return [summarise(run, killed_at) for r, run in enumerate(runs) if r != victim]


__all__ = ["QuorumReport", "StepRecord", "replica", "summarise", "torchft_kill_experiment"]
