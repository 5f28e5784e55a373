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

import dataclasses
import os
import signal

import pytest
import torch

from distlab import launch, parity, reference, sharding
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
    assert 1 in first.members[PAUSED.steps - 1]  # it healed and trained with the others again


def test_the_paused_run_equals_one_process_on_each_steps_quorum(paused: list) -> None:
    members = [paused[0].members[t] for t in range(PAUSED.steps)]
    ref = ft_parity.survivors_reference(_task(), members, PAUSED.per_replica, PAUSED.replicas)
    parity.compare({"losses": [paused[0].losses[t] for t in range(PAUSED.steps)],
                    "parameters": paused[0].params},
                   {"losses": ref.losses, "parameters": ref.params}, dtype=torch.float32,
                   label="paused replica", against="one process on each step's quorum").assert_passed()


NAN_STEP = 2
CLEAN = ReplicaConfig(replicas=3, per_replica=6, steps=5)


def _task_with_a_nan() -> reference.Task:
    """The task with one input value NaN: in replica 1's rows of step 2 and in no other step's batch (the
    5 steps of 18 examples are one epoch of the 96: each example is drawn once)."""
    task = _task()
    rows = sharding.batch_indices(len(task), CLEAN.replicas * CLEAN.per_replica, NAN_STEP, CLEAN.seed)
    inputs = task.inputs.clone()
    inputs[rows[CLEAN.per_replica], 0] = float("nan")  # the first row of replica 1's slice
    return dataclasses.replace(task, inputs=inputs)


def test_a_nan_on_one_replica_is_skipped_by_all_and_committed_by_none() -> None:
    logs = run_replicas(_task_with_a_nan(), CLEAN, deadline=90)
    for log in logs:
        assert isinstance(log, ReplicaLog), log
        bad = [n for n, p in log.params.items() if not torch.isfinite(p).all()]
        assert not bad, f"replica {log.replica} committed the NaN step: {bad} are not finite"
    _assert_same_weights(logs)
    for log in logs:
        # skipped, not redone (a NaN in the data would come back at every attempt)
        assert log.skipped == [NAN_STEP] and sorted(log.losses) == [0, 1, 3, 4], (log.skipped, log.losses)
    # One process on the clean task that leaves out the skipped step's batch (its update was never applied)
    task = _task()
    batches = [b for t, b in enumerate(task.batches(CLEAN.steps, CLEAN.replicas * CLEAN.per_replica,
                                                    CLEAN.seed)) if t != NAN_STEP]
    model = task.build(CLEAN.seed)
    ref = reference.train_reference(model, batches, task.loss,
                                    reference.SGD(model.parameters(), ft_parity.LR,
                                                  momentum=ft_parity.MOMENTUM))
    parity.compare({"losses": [logs[0].losses[t] for t in (0, 1, 3, 4)], "parameters": logs[0].params},
                   {"losses": ref.losses, "parameters": ref.params}, dtype=torch.float32,
                   label="NaN on replica 1", against="one process without step 2").assert_passed()


HEALED = ReplicaConfig(replicas=3, per_replica=6, steps=4, join=(2, 2))


def _replica_dying_mid_heal(task: reference.Task, config: ReplicaConfig, who: int) -> ReplicaLog:
    """A replica slot whose replica `who` dies (SIGKILL) in the middle of a heal, after the first of the two
    messages: as the source if it is one (replica 0), as the replica behind if it is that one."""
    from distlab.fault_tolerance import heal, replicas

    def send_then_die(pg, quorum, model, optimizer, step):  # type: ignore[no-untyped-def]
        data = heal.state_bytes(model, optimizer, step)
        pg.send([torch.tensor([data.numel()], dtype=torch.int64)], quorum.rank_of(quorum.behind[0]), 0).wait()
        os.kill(os.getpid(), signal.SIGKILL)

    def recv_then_die(pg, quorum, model, optimizer):  # type: ignore[no-untyped-def]
        pg.recv([torch.zeros(1, dtype=torch.int64)], quorum.rank_of(quorum.source), 0).wait()
        os.kill(os.getpid(), signal.SIGKILL)

    if launch.rank() == who:
        heal.send_state, heal.recv_state = send_then_die, recv_then_die  # this rank's own module
    return replicas.train_replica(task, config)


@pytest.mark.parametrize("who", [0, 2], ids=["source killed mid-send", "joiner killed mid-receive"])
def test_a_heal_that_fails_is_a_failed_round_and_a_new_quorum(who: int) -> None:
    logs = launch.run(_replica_dying_mid_heal, HEALED.replicas, _task(), HEALED, who,
                      backend="gloo", deadline=90, timeout=HEALED.join_timeout, may_fail=[who])
    assert isinstance(logs[who], launch.RankError) and "SIGKILL" in str(logs[who])
    alive = [log for r, log in enumerate(logs) if r != who]
    _assert_same_weights(alive)
    first = alive[0]
    assert first.failed_rounds and all(who not in first.members[t] for t in range(2, HEALED.steps))
    members = [first.members[t] for t in range(HEALED.steps)]
    ref = ft_parity.survivors_reference(_task(), members, HEALED.per_replica, HEALED.replicas)
    parity.compare({"losses": [first.losses[t] for t in range(HEALED.steps)], "parameters": first.params},
                   {"losses": ref.losses, "parameters": ref.params}, dtype=torch.float32,
                   label=f"replica {who} killed mid-heal", against="one process on each step's quorum"
                   ).assert_passed()
