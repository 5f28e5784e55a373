"""Replicas that heal: data-parallel training that goes on when a replica dies and takes it back later.

`run_replicas(task, config)` starts one process per replica slot with `distlab.launch.run` (the replica
that is killed is in `may_fail`). Each replica trains its slice of every step's batch (replica i takes
rows i*b .. (i+1)*b - 1 of the `replicas` x b batch of the step) and, every step:

1. agrees on a quorum with the others (`quorum.QuorumClient`); if it is behind the quorum's step it
   heals from the quorum's source (`heal.recv_state`) before the step, and the source sends;
2. computes its gradient and its loss and averages them over the quorum's members with one all-reduce
   on the quorum's own gloo group (`heal.make_group`, a new one whenever the members change);
3. votes ok, failed (its all-reduce raised, or its heal did) or nonfinite (the average holds a NaN or
   an infinity) and acts on the round's one decision (`QuorumClient.decide`, the same on every member):
   commit applies the step; redo leaves it to a new round without the dead; skip drops its update and
   goes on at the next step (`log.skipped`).

`config.kill = (replica, step)`: that replica SIGKILLs itself at that step after its backward, while the
others wait for it in the all-reduce. `config.join = (replica, step)`: that slot stays out until the
others have done that many steps, then checks in, heals and trains (a replacement for the dead one, or a
new one). `config.pause = (replica, step, seconds)`: that replica stops (SIGSTOP, every thread) after
its all-reduce at that step, before its vote, for that many seconds (a stalled host). So that the join
lands at that step on every run, however the machine schedules the processes, the others wait at its
round until it has checked in (at most `join_timeout`), and one step after a pause they wait for the
paused replica the same way: without that a slow newcomer could find the run already over.

What the run must equal: one process whose batch at step t is the union of the slices of step t's quorum
members (`parity.survivors_reference`): the average of equal-sized slices' mean losses
is the mean loss of their union, and the quorum's averaged gradient is its gradient.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from distlab import launch, reference
from distlab.fault_tolerance import heal, scripted
from distlab.fault_tolerance.parity import LR, MOMENTUM
from distlab.fault_tolerance.quorum import (
    COMMIT,
    FAILED,
    NONFINITE,
    OK,
    REDO,
    Quorum,
    QuorumClient,
    check_quorum_config,
    connect,
)


@dataclass(frozen=True)
class ReplicaConfig:
    """One run: `replicas` slots, `per_replica` examples each per step, `steps` steps; a `kill` and a
    `join` as (replica, step) and a `pause` as (replica, step, seconds), or None (the module docstring);
    the quorum's timeouts in seconds."""

    replicas: int = 3
    per_replica: int = 8
    steps: int = 6
    kill: tuple[int, int] | None = None
    join: tuple[int, int] | None = None
    pause: tuple[int, int, float] | None = None
    min_replicas: int = 1
    heartbeat_interval: float = 0.05
    heartbeat_timeout: float = 1.0
    join_timeout: float = 20.0
    collective_timeout: float = 5.0
    seed: int = 0

    def check(self) -> None:
        check_quorum_config(self.replicas, self.min_replicas, self.heartbeat_interval,
                            self.heartbeat_timeout, self.join_timeout)
        for name in ("per_replica", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        _check_seconds("collective_timeout", self.collective_timeout,
                       "how long a gradient all-reduce or a heal waits for a peer, e.g. 5.0")
        self._check_events()
        self._check_reachable()

    def _check_reachable(self) -> None:
        """min_replicas against the replicas that start (a joiner starts late) and those left after a kill."""
        starting = self.replicas - (self.join is not None)
        if self.join is not None and starting < self.min_replicas:
            raise ValueError(f"min_replicas={self.min_replicas} is never reached: join={self.join} keeps "
                             f"slot {self.join[0]} out until step {self.join[1]}, so only {starting} "
                             f"replicas start; lower min_replicas to {starting} or add a replica")
        if self.kill and starting - 1 < self.min_replicas:
            raise ValueError(f"kill={self.kill} leaves fewer than min_replicas={self.min_replicas} replicas; "
                             "lower min_replicas or add replicas")

    def _check_events(self) -> None:
        """kill, join and pause: a replica slot and a step inside the run, each event on its own slot."""
        for name, last in (("kill", self.steps - 1), ("join", self.steps - 1), ("pause", self.steps - 2)):
            self._check_event(name, last)
        if self.pause is not None:
            _check_seconds(f"pause={self.pause!r}: its seconds", self.pause[2],
                           "e.g. 4.0, longer than heartbeat_timeout so that the others give up on it")
        self._check_own_slots()

    def _check_event(self, name: str, last: int) -> None:
        """Event `name` (None, or a tuple of a replica slot and a step from its first to `last`)."""
        event = getattr(self, name)
        if event is None:
            return
        first, size = (1, 2) if name != "pause" else (0, 3)
        shape = "(replica, step)" if size == 2 else "(replica, step, seconds)"
        if not isinstance(event, tuple) or len(event) != size \
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in event[:2]) \
                or not (0 <= event[0] < self.replicas and first <= event[1] <= last):
            raise ValueError(f"{name}={event!r} must be {shape} with a replica from 0 to "
                             f"{self.replicas - 1} and a step from {first} to {last}")

    def _check_own_slots(self) -> None:
        """No two of kill, join and pause on the same replica slot."""
        slots = [(n, e[0]) for n, e in (("kill", self.kill), ("join", self.join), ("pause", self.pause)) if e]
        for a, (name, slot) in enumerate(slots):
            for other, slot2 in slots[a + 1:]:
                if slot == slot2:
                    raise ValueError(f"{name}={getattr(self, name)} and {other}={getattr(self, other)} name "
                                     f"the same slot; script each event on its own slot (a killed process "
                                     "does not come back under launch.run)")


def _check_seconds(name: str, value: object, example: str) -> None:
    """A positive finite duration, or a ValueError naming `name` (a timeout of 0 s never waits)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name}={value!r} must be a positive finite number of seconds: {example}")


@dataclass
class ReplicaLog:
    """What one replica saw: per committed step its loss (averaged over the quorum), per done step the
    quorum's members; the rounds redone, the steps skipped (not finite), the heals that failed (the
    error's first line); the times of detection and healing; its final parameters."""

    replica: int
    losses: dict[int, float] = field(default_factory=dict)
    members: dict[int, tuple[int, ...]] = field(default_factory=dict)
    failed_rounds: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed_heals: list[str] = field(default_factory=list)
    detect_s: float | None = None
    heal_s: float | None = None
    heal_bytes: int = 0
    step_s: list[float] = field(default_factory=list)
    params: dict[str, torch.Tensor] = field(default_factory=dict)


def _gradient_average(pg, model: nn.Module, loss: torch.Tensor, size: int) -> str:  # type: ignore[no-untyped-def]
    """All-reduce the gradients and the loss as one flat buffer. The vote: FAILED if a member failed,
    NONFINITE if the average holds a NaN or an infinity, OK otherwise."""
    params = [p for p in model.parameters()]
    flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
    try:
        pg.allreduce([flat]).wait()
    except RuntimeError:
        return FAILED
    flat /= size
    start = 0
    for p in params:
        p.grad.copy_(flat[start:start + p.numel()].view_as(p))
        start += p.numel()
    loss.data.fill_(flat[-1])
    return OK if bool(torch.isfinite(flat).all()) else NONFINITE


def train_replica(task: reference.Task, config: ReplicaConfig) -> ReplicaLog:
    """One replica slot (launch rank = replica id); see the module docstring."""
    me, c = launch.rank(), config
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store, beat = connect(host, port, "distlab-ft/"), connect(host, port, "distlab-ft/")
    joiner = c.join is not None and c.join[0] == me
    log = ReplicaLog(me)
    model = task.build(c.seed)
    optimizer = reference.SGD(model.parameters(), LR, momentum=MOMENTUM)
    if joiner:  # a slot that starts later: wait until the others have done join-step steps
        scripted.wait_for_progress(store, c.join[1])
    client = QuorumClient(store, beat, me, c.replicas, c.min_replicas, c.heartbeat_interval,
                          c.heartbeat_timeout, c.join_timeout)
    starting = tuple(r for r in range(c.replicas) if not (c.join and r == c.join[0]))
    step, groups = (-1 if joiner else 0), {}
    round_, expected = (client.next_round(), ()) if joiner else (0, starting)
    asked = time.monotonic()
    while step < c.steps:
        scripted.wait_for_scripted(c, me, step, store, round_, expected)
        q = client.quorum(round_, step, expected)
        if me not in q.members:
            round_, expected = client.next_round(), ()
            continue
        _note_detection(log, store, expected, q.members)
        began = time.monotonic()
        step, vote, loss = _attempt(task, c, q, groups, model, optimizer, step, log, asked, store)
        decision = client.decide(q, vote)  # the round's one decision, the same on every member
        step = _apply(decision, q, me, step, optimizer, loss, log, began, store)
        if decision == REDO:
            groups = {}  # a group whose collective failed is not used again
        round_, expected = round_ + 1, q.members
    client.finish(c.steps)
    client.close()
    log.params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return log


def _attempt(task: reference.Task, c: ReplicaConfig, q: Quorum, groups: dict, model: nn.Module,
             optimizer: reference.SGD, step: int, log: ReplicaLog, asked: float, store: dist.Store
             ) -> tuple[int, str, torch.Tensor | None]:
    """This replica's part of round `q.round`: join the quorum's group (kept in `groups`), heal or send,
    backward on its slice, the gradient average. The step it is at, its vote, its loss. A peer that dies
    while the group forms or while the state travels makes the vote FAILED: the round is redone with
    a new quorum, and a replica still behind heals again from that quorum's source."""
    me = launch.rank()
    try:
        if q.quorum_id not in groups:
            groups.clear()
            groups[q.quorum_id] = heal.make_group(store, q, me, c.collective_timeout)
        pg = groups[q.quorum_id]
        step = _heal_or_send(pg, q, me, model, optimizer, step, log, asked)
    except RuntimeError as e:  # gloo's and the store's errors (DistError is a RuntimeError)
        log.failed_heals.append(f"round {q.round}: {type(e).__name__}: {str(e).splitlines()[0]}")
        return step, FAILED, None
    loss = _backward_on_slice(task, c, me, step, model, optimizer)
    scripted.kill_if_due(c, me, step, store)
    vote = _gradient_average(pg, model, loss, len(q.members))
    scripted.pause_if_due(c, me, step, store)
    return step, vote, loss


def _apply(decision: str, q: Quorum, me: int, step: int, optimizer: reference.SGD,
           loss: torch.Tensor | None, log: ReplicaLog, began: float, store: dist.Store) -> int:
    """Act on the round's decision: REDO leaves the step to the next round; COMMIT applies it (every
    member's vote was OK, so `loss` is this round's); SKIP drops its update. Either way the step is
    done: log it, (the source) publish the progress, and return the next step."""
    if decision == REDO:
        log.failed_rounds.append(q.round)
        return step
    if decision == COMMIT and loss is not None:
        optimizer.step()
        log.losses[step] = loss.item()
    else:
        log.skipped.append(step)
    log.members[step] = q.members
    log.step_s.append(time.monotonic() - began)
    if me == q.source:
        store.set("progress", str(step + 1))
    return step + 1


def _note_detection(log: ReplicaLog, store: dist.Store, expected: tuple[int, ...],
                    members: tuple[int, ...]) -> None:
    """The first time a quorum lacks an expected member: the seconds since the kill (its time is in
    the store)."""
    dropped = expected and set(expected) - set(members)
    if dropped and log.detect_s is None and store.check(["killed_at"]):
        log.detect_s = time.time() - float(store.get("killed_at"))


def _heal_or_send(pg: dist.ProcessGroup, q: Quorum, me: int, model: nn.Module, optimizer: reference.SGD,
                  step: int, log: ReplicaLog, asked: float) -> int:
    """A replica behind the quorum receives the source's state (and its step); the source sends it. The
    step this replica trains next."""
    if me in q.behind:
        step = heal.recv_state(pg, q, model, optimizer)
        log.heal_s = time.monotonic() - asked
    elif me == q.source and q.behind:
        log.heal_bytes += heal.send_state(pg, q, model, optimizer, step)
    return step


def _backward_on_slice(task: reference.Task, c: ReplicaConfig, me: int, step: int, model: nn.Module,
                       optimizer: reference.SGD) -> torch.Tensor:
    """This replica's rows of the step's batch (slice `me` of `replicas`): forward, backward
    (`Task.shard_backward`); the loss on them."""
    x, y = task.batch(step, c.replicas * c.per_replica, c.seed)
    optimizer.zero_grad()
    return task.shard_backward(model, x, y, me, c.replicas)


def run_replicas(task: reference.Task, config: ReplicaConfig, deadline: float = 120.0
                 ) -> list[ReplicaLog | launch.RankError]:
    """Start `config.replicas` replica slots as ranks; the killed one may fail. Each slot's log (or,
    for the killed one, its RankError), in replica order."""
    config.check()
    may_fail = [config.kill[0]] if config.kill else []
    return launch.run(train_replica, config.replicas, task, config, backend="gloo", deadline=deadline,
                      timeout=config.join_timeout, may_fail=may_fail)
