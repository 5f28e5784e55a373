"""One decision per round (chapter 11, part 2): replicas never split, and a non-finite step is never applied.

A replica paused between its all-reduce and its vote (SIGSTOP, longer than the heartbeat timeout) looks
dead to the others, who decide not to commit and redo the step without it. When it wakes it must read
that decision, not take its own from the votes it finds: before, it saw three "ok" votes and committed
alone, and the replicas trained on with different weights while the run returned normally (issue 37).
Now it drops the step, checks in behind the others, heals, and ends with the same weights as they do.

A NaN on one replica's data is all-reduced into every replica; the vote must see that the average is not
finite, and every member must skip that step's update (as a loss scaler skips an overflowing step).
"""

from __future__ import annotations

import pytest
import torch

from distlab import parity, reference
from distlab.fault_tolerance import parity as ft_parity
from distlab.fault_tolerance.replicas import ReplicaConfig, ReplicaLog, run_replicas

PAUSED = ReplicaConfig(replicas=3, per_replica=6, steps=5, pause=(1, 2, 4.0))


def _task() -> reference.Task:
    return reference.mlp_task(sizes=(6, 11, 5), n=96)


def _assert_same_weights(logs: list) -> None:
    for log in logs:
        assert isinstance(log, ReplicaLog), log
    for other in logs[1:]:
        for name, p in logs[0].params.items():
            assert torch.equal(other.params[name], p), (
                f"replica {other.replica} ended with other weights than replica 0 in {name}: "
                f"{(other.params[name] - p).abs().max().item():.2e} apart")


@pytest.fixture(scope="module")
def paused() -> list:
    return run_replicas(_task(), PAUSED, deadline=90)


def test_a_replica_paused_before_its_vote_does_not_commit_alone(paused: list) -> None:
    _assert_same_weights(paused)
    first, woke = paused[0], paused[1]
    assert first.failed_rounds, "the others should have given up on the paused replica's vote"
    assert 1 not in first.members[2] and woke.heal_s is not None  # step 2 was redone without it
    assert all(1 in first.members[t] for t in (0, 1, 3, 4))


def test_the_paused_run_equals_one_process_on_each_steps_quorum(paused: list) -> None:
    members = [paused[0].members[t] for t in range(PAUSED.steps)]
    ref = ft_parity.survivors_reference(_task(), members, PAUSED.per_replica, PAUSED.replicas)
    parity.compare({"losses": [paused[0].losses[t] for t in range(PAUSED.steps)],
                    "parameters": paused[0].params},
                   {"losses": ref.losses, "parameters": ref.params}, dtype=torch.float32,
                   label="paused replica", against="one process on each step's quorum").assert_passed()
