"""The parameter server's loop: one handler per kind of message, and what the server logs.

The server (position 0 of the job's group) holds the parameters (Dean et al. 2012, sec. 4.1; Li et al.
2014, sec. 3). One listener thread per worker receives that worker's messages and puts them, or the error
that ended its connection, in one inbox; the main loop takes them one at a time and hands each to the
handler of its kind:

| kind | handler | what the server does |
| --- | --- | --- |
| PULL | `on_pull` | the worker waits for parameters (its first message) |
| PUSH | `on_push` | apply the gradient (sync: the round's average, once complete), log it; the worker waits |
| BYE | `on_bye` | nothing: the worker has left after STOP |
| (a broken connection) | `on_lost` | declare the worker dead |

Between messages the server answers every waiting worker that the consistency rule admits
(`ssp.may_start`: threshold 0 for sync, s for SSP, infinity for async) and, in the asynchronous modes,
that the budget of steps x W gradients has room for (those applied plus those being computed); and it
declares dead any worker that owes it a message and has been silent for `worker_timeout` seconds. The
synchronous mode cannot go on without a worker, so there a death is an error that says so.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist

from distlab.async_sgd.config import PSConfig
from distlab.async_sgd.messages import Kind, Message, recv_message, send_message
from distlab.async_sgd.problem import flat_params
from distlab.async_sgd.ssp import may_start


class Update(NamedTuple):
    """One gradient the server applied. staleness = applied_version - read_version; clock_gap = how far
    the worker was ahead of the slowest live worker when it was sent the parameters."""

    worker: int
    clock: int
    read_version: int
    applied_version: int
    staleness: int
    clock_gap: int
    time: float


class Death(NamedTuple):
    """A worker the server declared dead: its clock (pushes received) and the server's version then."""

    worker: int
    clock: int
    version: int
    time: float


@dataclass
class ServerLog:
    """What the server saw: every update, parameter snapshots (version, seconds, params), deaths."""

    config: PSConfig
    num_workers: int
    updates: list[Update] = field(default_factory=list)
    snapshots: list[tuple[int, float, torch.Tensor]] = field(default_factory=list)
    deaths: list[Death] = field(default_factory=list)
    params: torch.Tensor | None = None
    version: int = 0


def _reason(e: Exception) -> str:
    """gloo's message without its source location and peer address (they change from run to run)."""
    reason = re.sub(r"^\[[^\]]*\]\s*", "", str(e).splitlines()[0]).split(". ")[0]
    return re.sub(r"\s*\[[\d.:]+\]:\d+", "", reason)


def listen(worker: int, group: dist.ProcessGroup | None, inbox: queue.Queue, timeout: float) -> None:
    """The server's listener for one worker (a thread): forward each message, or the error that ended the
    connection, to `inbox`; stop after the worker's BYE."""
    while True:
        try:
            msg = recv_message(worker, group, timeout)
        except RuntimeError as e:  # the worker's process is gone (gloo: "Connection closed by peer")
            inbox.put((worker, e))
            return
        inbox.put((worker, msg))
        if msg.kind == Kind.BYE:
            return


class Server:
    """The state of one run on the server, and a handler per kind of message (see the module docstring)."""

    def __init__(self, config: PSConfig, num_workers: int, group: dist.ProcessGroup | None) -> None:
        self.config, self.group = config, group
        model, _, _ = config.problem.build()
        self.params = flat_params(model)
        self.log = ServerLog(config, num_workers)
        self.start = time.perf_counter()
        self.log.snapshots.append((0, 0.0, self.params.clone()))
        self.inbox: queue.Queue = queue.Queue()
        self.clocks = {w: 0 for w in range(1, num_workers + 1)}
        self.alive, self.stopped = set(self.clocks), set()
        self.waiting: list[int] = []  # asked for parameters, not yet answered
        self.computing: set[int] = set()  # sent parameters, its gradient not yet received
        self.heard = {w: 0.0 for w in self.clocks}  # when each worker last sent, or was sent, something
        self.gap_at_read: dict[int, int] = {}
        self.pending: dict[int, tuple[torch.Tensor, int, int]] = {}  # sync: (gradient, clock, read version)
        self.version, self.applied = 0, 0
        self.handlers: dict[Kind, Callable[[int, Message, float], None]] = {
            Kind.PULL: self.on_pull, Kind.PUSH: self.on_push, Kind.BYE: self.on_bye}

    def now(self) -> float:
        return time.perf_counter() - self.start

    def run(self) -> ServerLog:
        """Serve until every live worker has been told to stop; return the log."""
        listeners = [threading.Thread(target=listen, args=(w, self.group, self.inbox, self.config.timeout),
                                      daemon=True) for w in self.clocks]
        for t in listeners:
            t.start()
        while self.alive - self.stopped:
            self.answer_waiting()
            if not self.alive - self.stopped:
                break
            try:
                w, msg = self.inbox.get(timeout=self.config.worker_timeout / 4)
            except queue.Empty:
                w, msg = None, None
            self.handle(w, msg, self.now())
        for t in listeners:  # every live worker answers STOP with BYE, which ends its listener
            t.join(timeout=self.config.worker_timeout)
        self.log.params, self.log.version = self.params, self.version
        return self.log

    def handle(self, w: int | None, msg: Message | Exception | None, now: float) -> None:
        """One turn of the loop: a broken connection, a message (or nothing), then the silence check."""
        if isinstance(msg, Exception):
            self.on_lost(w, msg, now)
            return
        if msg is not None:
            self.heard[w] = now
        self.check_silence(now)
        if msg is not None and w in self.alive:
            self.handlers[msg.kind](w, msg, now)

    def done(self) -> bool:
        if self.config.mode == "sync":
            return self.version >= self.config.steps
        return self.applied >= self.budget()

    def budget(self) -> int:
        """The asynchronous modes' number of gradients: steps x W."""
        return self.config.steps * self.log.num_workers

    def spent(self) -> bool:
        """Asynchronous modes: would one more gradient pass the budget? The gradients applied and those
        being computed already make it up (without this, a worker sent parameters just before the budget
        was reached pushed one gradient too many: `--steps 10` with 2 workers applied 21)."""
        return self.config.mode != "sync" and self.applied + len(self.computing) >= self.budget()

    def answer_waiting(self) -> None:
        """Send STOP to every waiting worker once training is done, else PARAMS to each the rule admits."""
        for w in list(self.waiting):
            live = [self.clocks[u] for u in self.alive]
            if not (self.done() or may_start(self.clocks[w], live, self.config.threshold)):
                continue
            if not self.done() and self.spent():  # it waits: STOP, or the gradient of one that dies
                continue
            self.waiting.remove(w)
            try:
                if self.done():
                    send_message(Kind.STOP, w, self.version, None, w, self.group, self.config.timeout)
                    self.stopped.add(w)
                else:
                    self.gap_at_read[w] = self.clocks[w] - min(live)
                    send_message(Kind.PARAMS, w, self.version, self.params, w, self.group,
                                 self.config.timeout)
                    self.computing.add(w)
                    self.heard[w] = self.now()
            except RuntimeError as e:  # it died while waiting for its answer
                self.declare_dead(w, self.now(), f"lost its connection ({_reason(e)})")

    def check_silence(self, now: float) -> None:
        """Declare dead every worker that owes the server a message and has been silent too long."""
        for u in sorted(self.alive - self.stopped - set(self.waiting)):
            if now - self.heard[u] > self.config.worker_timeout:
                self.declare_dead(u, now, f"sent nothing for {now - self.heard[u]:.1f} s "
                                          f"(worker_timeout={self.config.worker_timeout} s)")

    def declare_dead(self, w: int, now: float, why: str) -> None:
        if self.config.mode == "sync":
            raise RuntimeError(
                f"synchronous mode: worker {w} {why} at version {self.version}, and a synchronous step needs "
                f"a gradient from every worker, so training cannot go on. Use mode='async' or 'ssp' to "
                f"continue without a dead worker")
        self.alive.discard(w)
        self.computing.discard(w)  # its gradient will never come: another worker makes it up
        if w in self.waiting:
            self.waiting.remove(w)
        self.log.deaths.append(Death(w, self.clocks[w], self.version, now))

    # --- one handler per kind of message ---------------------------------------------------------------

    def on_lost(self, w: int, error: Exception, now: float) -> None:
        if w in self.alive:
            self.declare_dead(w, now, f"lost its connection ({_reason(error)})")

    def on_pull(self, w: int, msg: Message, now: float) -> None:
        self.waiting.append(w)

    def on_bye(self, w: int, msg: Message, now: float) -> None:
        """The worker has left after STOP; its listener ends."""

    def on_push(self, w: int, msg: Message, now: float) -> None:
        self.computing.discard(w)
        clock, self.clocks[w] = self.clocks[w], self.clocks[w] + 1
        if self.config.mode == "sync":
            self.pending[w] = (msg.payload, clock, msg.version)
            if len(self.pending) == len(self.alive):  # the round is complete: apply the average once
                self.params -= self.config.lr * torch.stack([g for g, _, _ in self.pending.values()]).mean(0)
                self.log.updates += [
                    Update(u, c, read, self.version, self.version - read, self.gap_at_read[u], now)
                    for u, (_, c, read) in sorted(self.pending.items())]
                self.pending.clear()
                self.version += 1
        else:
            self.params -= self.config.lr * msg.payload
            self.log.updates.append(Update(w, clock, msg.version, self.version, self.version - msg.version,
                                           self.gap_at_read[w], now))
            self.version += 1
        self.applied += 1
        if self.version % self.config.record_every == 0 and self.log.snapshots[-1][0] != self.version:
            self.log.snapshots.append((self.version, now, self.params.clone()))
        self.waiting.append(w)  # it waits for its next parameters


def serve(config: PSConfig, num_workers: int, group: dist.ProcessGroup | None = None) -> ServerLog:
    """The server's loop, at position 0 of `group` (None: the whole world), with workers 1..num_workers."""
    return Server(config, num_workers, group).run()
