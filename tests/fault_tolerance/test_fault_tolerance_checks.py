"""Chapter 11's boundary checks that issue 37 found missing: each bad value is refused with an error that
names the parameter and the fix, before any rank starts (no ranks here)."""

from __future__ import annotations

import datetime
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from distlab.fault_tolerance import DiLoCo, StreamingDiLoCo, layer_fragments
from distlab.fault_tolerance.quorum import QuorumClient
from distlab.fault_tolerance.replica_loop import Recipe
from distlab.fault_tolerance.replicas import ReplicaConfig


@pytest.mark.parametrize("timeout", [0, -1.0, math.inf, math.nan, "5"])
def test_a_collective_timeout_that_never_waits_is_refused(timeout: object) -> None:
    with pytest.raises(ValueError, match=r"collective_timeout=.* must be a positive finite number of sec"):
        ReplicaConfig(collective_timeout=timeout).check()  # type: ignore[arg-type]


def test_a_min_replicas_that_the_starting_replicas_cannot_reach_is_refused() -> None:
    # Slot 2 joins at step 3, so 2 replicas start; a quorum of 3 would never form (before: accepted).
    with pytest.raises(ValueError, match=r"min_replicas=3 is never reached: join=\(2, 3\) keeps slot 2 out "
                                         r"until step 3, so only 2 replicas start; lower min_replicas to 2"):
        ReplicaConfig(replicas=3, min_replicas=3, join=(2, 3)).check()
    ReplicaConfig(replicas=3, min_replicas=2, join=(2, 3)).check()  # reachable: accepted


def test_a_scripted_pause_is_checked_like_kill_and_join() -> None:
    with pytest.raises(ValueError, match=r"pause=\(1, 5, 4.0\) must be \(replica, step, seconds\) with a "
                                         r"replica from 0 to 2 and a step from 0 to 4"):
        ReplicaConfig(replicas=3, steps=6, pause=(1, 5, 4.0)).check()
    with pytest.raises(ValueError, match=r"pause=\(1, 2, 0\): its seconds=0 must be a positive finite"):
        ReplicaConfig(replicas=3, pause=(1, 2, 0)).check()
    with pytest.raises(ValueError, match=r"kill=\(1, 2\) and pause=\(1, 3, 4.0\) name the same slot"):
        ReplicaConfig(replicas=3, kill=(1, 2), pause=(1, 3, 4.0)).check()


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool, torch.complex64, "bfloat16"])
def test_a_sync_dtype_that_is_not_floating_is_refused(dtype: object) -> None:
    # int8 rounded every pseudo-gradient to 0 (training stopped in silence); bool gave a loss of 1002.
    with pytest.raises(ValueError, match=r"sync_dtype=.* must be None .* or a floating dtype"):
        Recipe("diloco", 2, sync_dtype=dtype)  # type: ignore[arg-type]
    model = nn.Linear(3, 2)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"sync_dtype=.* must be None"):
        DiLoCo(model, inner, 2, sync_dtype=dtype)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"sync_dtype=.* must be None"):
        StreamingDiLoCo(model, inner, 2, layer_fragments(model, 2), sync_dtype=dtype)  # type: ignore[arg-type]
    Recipe("diloco", 2, sync_dtype=torch.bfloat16)  # the lower precision the chapter uses: accepted


@pytest.mark.parametrize("lr", [math.inf, math.nan, -0.7, 0])
def test_an_outer_lr_that_is_not_positive_and_finite_is_refused(lr: float) -> None:
    # outer_lr=inf made every weight NaN at the first outer step
    with pytest.raises(ValueError, match=r"outer_lr=.* must be a positive number \(finite\)"):
        Recipe("diloco", 2, outer_lr=lr)
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"outer_lr=.* must be a positive number \(finite\)"):
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), 2, outer_lr=lr)


def test_the_recipe_checks_its_inner_lr_and_outer_momentum() -> None:
    with pytest.raises(ValueError, match=r"inner_lr=inf must be a positive finite number"):
        Recipe("diloco", 2, inner_lr=math.inf)
    with pytest.raises(ValueError, match=r"outer_momentum=1.0 must be in \[0, 1\)"):
        Recipe("diloco", 2, outer_momentum=1.0)


def test_a_second_process_claiming_a_replica_id_gets_a_clear_error() -> None:
    # Before, it was not detected: the two shared a heartbeat and a rank, and the real one hung.
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=10))
    beat = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=datetime.timedelta(seconds=10))
    first = QuorumClient(master, beat, replica=1, replicas=3)
    try:
        with pytest.raises(ValueError, match=r"replica=1 is already claimed by the process .*:\d+:\w+ "
                                             r"\(host:pid:client\) in this run's store; give every replica"):
            QuorumClient(master, beat, replica=1, replicas=3)
        other = QuorumClient(master, beat, replica=2, replicas=3)  # another id: fine
        other.close()
    finally:
        first.close()


def test_a_replica_left_behind_when_the_others_finish_is_told_so_at_once() -> None:
    # Before, it waited join_timeout and then asked "are any replicas training?"
    import time

    from distlab.fault_tolerance.quorum import QuorumError

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=10))
    beat = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=datetime.timedelta(seconds=10))
    done = QuorumClient(master, beat, replica=0, replicas=2, heartbeat_interval=0.02, heartbeat_timeout=0.1,
                        join_timeout=5.0)
    late = QuorumClient(master, beat, replica=1, replicas=2, heartbeat_interval=0.02, heartbeat_timeout=0.1,
                        join_timeout=5.0)
    try:
        done.finish(5)
        start = time.monotonic()
        with pytest.raises(QuorumError, match=r"replica 1 is outside the quorum at step 2, and the others "
                                              r"finished the run \(5 steps\) without it: nobody is left"):
            late.quorum(3, 2, expected=())
        assert time.monotonic() - start < 2
    finally:
        done.close()
        late.close()
