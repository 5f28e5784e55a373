"""Replicas that heal (chapter 11, part 2): a quorum every step, a replica SIGKILLed mid-step, a new one
that joins later and takes its state from a live peer.

One launch of 4 replica slots: replicas 0-2 start, replica 2 kills itself at step 2 after its backward
(the others are waiting for it in the all-reduce), slot 3 joins once the others have done 4 steps. The
run must lose no step, redo the round it interrupted, and equal one process whose batch at every step is the
union of that step's quorum members' slices; the replica that joined must hold the same model. The
launch bounds the time (deadline) and leaves no process behind.
"""

from __future__ import annotations

import os

import pytest
import torch

from distlab import launch, parity, reference
from distlab.fault_tolerance import parity as ft_parity
from distlab.fault_tolerance.quorum import Quorum, QuorumClient
from distlab.fault_tolerance.replicas import ReplicaConfig, ReplicaLog, run_replicas
from distlab.launch import cleanup, zygote

CONFIG = ReplicaConfig(replicas=4, per_replica=6, steps=6, kill=(2, 2), join=(3, 4))


def _task() -> reference.Task:
    return reference.mlp_task(sizes=(6, 11, 5), n=96)


@pytest.fixture(scope="module")
def logs() -> list:
    out = run_replicas(_task(), CONFIG, deadline=90)
    helper = {zygote.helper().proc.pid} if zygote.usable() else set()  # the launcher's fork helper stays
    left = [pid for pid, _ in cleanup.descendants([os.getpid()]) if pid not in helper]
    assert not left, "the launch left a process behind"
    return out


def test_the_killed_replica_is_reported_and_the_others_lose_no_step(logs: list) -> None:
    assert isinstance(logs[2], launch.RankError) and "SIGKILL" in str(logs[2])
    survivors = [logs[0], logs[1]]
    for log in survivors:
        assert isinstance(log, ReplicaLog)
        assert sorted(log.losses) == list(range(CONFIG.steps))  # every step, none lost
        assert log.failed_rounds  # the round in which replica 2 died, redone without it
        assert log.members[0] == (0, 1, 2) and all(2 not in log.members[t] for t in range(2, CONFIG.steps))
        assert log.detect_s is not None and log.detect_s > 0
    joined = logs[3]
    assert 3 in joined.members[CONFIG.steps - 1] and joined.heal_s is not None
    assert min(joined.losses) >= CONFIG.join[1]
    assert logs[0].heal_bytes > 0  # the source (replica 0) sent the state


def test_the_run_equals_one_process_on_the_survivors_data(logs: list) -> None:
    members = [logs[0].members[t] for t in range(CONFIG.steps)]
    ref = ft_parity.survivors_reference(_task(), members, CONFIG.per_replica, CONFIG.replicas)
    ours = [logs[0].losses[t] for t in range(CONFIG.steps)]
    parity.compare({"losses": ours, "parameters": logs[0].params},
                   {"losses": ref.losses, "parameters": ref.params}, dtype=torch.float32,
                   label="killed replica", against="one process on the survivors' data").assert_passed()
    for other in (logs[1], logs[3]):  # the survivor and the healed newcomer hold the same model
        parity.compare(other.params, logs[0].params, dtype=torch.float32).assert_passed()


def test_bad_configurations_are_refused_before_any_rank_starts() -> None:
    with pytest.raises(ValueError, match=r"min_replicas=4 must be between 1 and replicas=3"):
        ReplicaConfig(replicas=3, min_replicas=4).check()
    with pytest.raises(ValueError, match=r"min_replicas=0 must be between 1 and replicas=3"):
        ReplicaConfig(replicas=3, min_replicas=0).check()
    with pytest.raises(ValueError, match=r"kill=\(1, 2\) leaves fewer than min_replicas=3 replicas"):
        ReplicaConfig(replicas=3, min_replicas=3, kill=(1, 2)).check()
    with pytest.raises(ValueError, match=r"kill=\(1, 9\) must be \(replica, step\)"):
        ReplicaConfig(replicas=3, kill=(1, 9)).check()
    with pytest.raises(ValueError, match=r"name the same slot"):
        ReplicaConfig(replicas=3, kill=(1, 2), join=(1, 3)).check()
    with pytest.raises(ValueError, match=r"heartbeat_timeout=0.05 must exceed two heartbeat intervals"):
        ReplicaConfig(heartbeat_timeout=0.05).check()
    with pytest.raises(ValueError, match=r"replica=5 must be a replica id from 0 to 2"):
        QuorumClient(None, None, 5, 3)  # type: ignore[arg-type]


def test_a_quorum_survives_its_encoding_and_names_who_heals() -> None:
    q = Quorum(7, 5, (0, 1, 3), (4, 4, -1))
    assert Quorum.decode(7, q.encode()) == q
    assert (q.step, q.source, q.behind, q.rank_of(3)) == (4, 0, (3,), 2)
