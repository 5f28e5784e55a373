"""A quorum every step: the replica groups alive agree, through a key-value store, on who takes part.

Vocabulary from torchft (its `Manager`: quorum, quorum id, heal, should_commit), the code our own. Every
replica keeps a heartbeat (a counter it bumps in the store every `heartbeat_interval` seconds from a
thread; a replica whose counter has not moved for `heartbeat_timeout` seconds is dead). Every step is
one or more *rounds*; round k goes:

1. check in: each replica writes its step under `r{k}/in/{replica}`;
2. decide: once every member of round k-1 has checked in or is dead, the first replica to get there
   proposes the replicas checked in so far, with `compare_set` on `r{k}/quorum`: the store keeps the
   first proposal and every replica reads that one, so all agree even if they saw different check-ins.
   The quorum's `step` is the largest step among its members; a member behind it heals from `source`
   (`heal.py`). Its `quorum_id` stays that of round k-1 when the members are the same and round k-1
   was not redone (the replicas keep their process group), and becomes k otherwise (a fresh group);
3. decide: after the gradient average each member votes "ok", "failed" (its collective raised) or
   "nonfinite" (the averaged gradient or loss holds a NaN or an infinity), and tallies the votes: every
   member's vote "ok" gives "commit"; a vote "failed", or a member that died or timed out before voting,
   gives "redo"; otherwise ("nonfinite") "skip". The tally is only a proposal: `compare_set` on
   `r{k}/decision` keeps the first one, and every member acts on that stored decision, never on its own
   tally. So the members of a round all commit, all redo or all skip, even when one of them was paused
   between its all-reduce and its vote, looked dead, and on waking found every vote "ok": it reads the
   "redo" the others stored and drops the step with them. "commit": apply the step. "redo": drop it and
   redo it in round k+1 without the dead (a replica killed mid-step never votes: the others see its
   heartbeat stop); no step is lost, one attempt is. "skip": nobody applies it and training goes on at
   the next step, as PyTorch's GradScaler skips an optimizer step whose gradients hold an inf or a NaN;
   a NaN in one replica's data would come back at every redo.

A replica outside the quorum (one that comes back, or a new one) checks in at the round after the newest
decided one, and again until a quorum takes it. The store must outlive the replicas: `distlab.launch`'s
TCPStore lives in the launcher process (under torchrun, put it outside the workers, as torchft's
lighthouse is).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import torch.distributed as dist

POLL = 0.005  # seconds between looks at the store
OK, FAILED, NONFINITE = "ok", "failed", "nonfinite"  # a member's vote
COMMIT, REDO, SKIP = "commit", "redo", "skip"  # the round's one decision


@dataclass(frozen=True)
class Quorum:
    """One round's agreement: `members` (replica ids, sorted), each member's `steps`, the step they
    train, the round and the process group's id."""

    round: int
    quorum_id: int
    members: tuple[int, ...]
    steps: tuple[int, ...]

    @property
    def step(self) -> int:
        """The step this quorum trains: the furthest any member has come (torchft's max_step)."""
        return max(self.steps)

    @property
    def source(self) -> int:
        """The member every replica behind heals from: the lowest replica id at `step`."""
        return min(m for m, s in zip(self.members, self.steps, strict=True) if s == self.step)

    @property
    def behind(self) -> tuple[int, ...]:
        """Members that must heal before the step (a replica that comes back, or a new one)."""
        return tuple(m for m, s in zip(self.members, self.steps, strict=True) if s < self.step)

    def rank_of(self, replica: int) -> int:
        return self.members.index(replica)

    def encode(self) -> str:
        return f"{self.quorum_id};" + ",".join(f"{m}:{s}" for m, s in zip(self.members, self.steps,
                                                                          strict=True))

    @classmethod
    def decode(cls, round_: int, text: str) -> Quorum:
        qid, pairs = text.split(";")
        parsed = [tuple(map(int, p.split(":"))) for p in pairs.split(",")]
        return cls(round_, int(qid), tuple(m for m, _ in parsed), tuple(s for _, s in parsed))


class QuorumError(RuntimeError):
    """No quorum of at least `min_replicas` replicas formed within the join timeout."""


def check_quorum_config(replicas: int, min_replicas: int, heartbeat_interval: float,
                        heartbeat_timeout: float, join_timeout: float) -> None:
    """ValueErrors that name the bad parameter and the fix."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas={replicas!r} must be a positive integer (the most replica groups)")
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) \
            or not 1 <= min_replicas <= replicas:
        raise ValueError(f"min_replicas={min_replicas!r} must be between 1 and replicas={replicas}: a quorum "
                         "smaller than 1 trains nothing, and one larger than the replicas never forms")
    if not heartbeat_interval > 0:
        raise ValueError(f"heartbeat_interval={heartbeat_interval!r} must be > 0 seconds")
    if not heartbeat_timeout > 2 * heartbeat_interval:
        raise ValueError(f"heartbeat_timeout={heartbeat_timeout!r} must exceed two heartbeat intervals "
                         f"({2 * heartbeat_interval:g} s), or live replicas look dead between beats")
    if not join_timeout > heartbeat_timeout:
        raise ValueError(f"join_timeout={join_timeout!r} must exceed heartbeat_timeout={heartbeat_timeout!r}")


def connect(host: str, port: int, prefix: str, timeout: float = 30.0) -> dist.Store:
    """A client of the TCPStore at host:port, its keys under `prefix` (one run's namespace)."""
    from datetime import timedelta
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))
    return dist.PrefixStore(prefix, store)


class Heartbeat:
    """A thread that bumps `hb/{replica}` every `interval` seconds until `stop()` (or the process dies)."""

    def __init__(self, store: dist.Store, replica: int, interval: float) -> None:
        self.store, self.key, self.interval = store, f"hb/{replica}", interval
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.store.add(self.key, 1)
        self.thread.start()

    def _beat(self) -> None:
        while not self.done.wait(self.interval):
            self.store.add(self.key, 1)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


class QuorumClient:
    """One replica's side of the protocol (the module docstring). `store` is this replica's own client
    (the heartbeat thread needs another: pass `beat_store`)."""

    def __init__(self, store: dist.Store, beat_store: dist.Store, replica: int, replicas: int,
                 min_replicas: int = 1, heartbeat_interval: float = 0.05, heartbeat_timeout: float = 1.0,
                 join_timeout: float = 20.0) -> None:
        check_quorum_config(replicas, min_replicas, heartbeat_interval, heartbeat_timeout, join_timeout)
        if isinstance(replica, bool) or not isinstance(replica, int) or not 0 <= replica < replicas:
            raise ValueError(f"replica={replica!r} must be a replica id from 0 to {replicas - 1}")
        self.store, self.replica, self.replicas = store, replica, replicas
        self._claim()
        self.min_replicas, self.join_timeout = min_replicas, join_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.heartbeat = Heartbeat(beat_store, replica, heartbeat_interval)
        self.seen: dict[int, tuple[int, float]] = {}  # replica -> (last counter, when it last moved)

    def _claim(self) -> None:
        """Take this replica id for this process, once per run's store: a second process with the same
        id would share its heartbeat, its check-ins and its rank in the quorum's group, and hang there."""
        me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"  # one client, even in one process
        holder = self.store.compare_set(f"claim/{self.replica}", "", me).decode()
        if holder != me:
            raise ValueError(f"replica={self.replica} is already claimed by the process {holder} "
                             f"(host:pid:client) in this run's store; give every replica process its own "
                             f"id from 0 to {self.replicas - 1}")

    # -- liveness -------------------------------------------------------------------------------------
    def alive(self, replica: int) -> bool:
        """Whether `replica`'s heartbeat moved within the last `heartbeat_timeout` seconds."""
        count, now = self.store.add(f"hb/{replica}", 0), time.monotonic()
        last = self.seen.get(replica)
        if last is None or last[0] != count:
            self.seen[replica] = (count, now)
            return True
        return now - last[1] < self.heartbeat_timeout

    def _has(self, key: str) -> bool:
        return self.store.check([key])

    # -- rounds ---------------------------------------------------------------------------------------
    def next_round(self) -> int:
        """The round a replica outside the quorum checks in at: one after the newest decided round."""
        return int(self.store.get("latest")) if self._has("latest") else 0

    def quorum(self, round_: int, step: int, expected: tuple[int, ...]) -> Quorum:
        """Check in at round `round_` with `step`, and return the quorum the replicas agree on. `expected`:
        the replicas to wait for (round k-1's members; the starting replicas in round 0)."""
        self.store.set(f"r{round_}/in/{self.replica}", str(step))
        start = time.monotonic()
        while not self._has(f"r{round_}/quorum"):
            if not expected:  # outside the quorum: the members decide, this replica waits to be taken
                self._check_not_finished(step)
                if time.monotonic() - start > self.join_timeout:
                    raise QuorumError(f"replica {self.replica}: round {round_} was not decided within "
                                      f"{self.join_timeout:g} s; are any replicas training?")
                time.sleep(POLL)
                continue
            waiting = [e for e in expected if e != self.replica and not self._has(f"r{round_}/in/{e}")]
            if not any(self.alive(e) for e in waiting):
                self._propose(round_)
                break
            if time.monotonic() - start > self.join_timeout:
                raise QuorumError(f"replica {self.replica}: no quorum in round {round_} after "
                                  f"{self.join_timeout:g} s; replicas {waiting} neither checked in nor died")
            time.sleep(POLL)
        return Quorum.decode(round_, self.store.get(f"r{round_}/quorum").decode())

    def _propose(self, round_: int) -> None:
        present = self._wait_for_min(round_)
        steps = [int(self.store.get(f"r{round_}/in/{i}")) for i in present]
        proposal = Quorum(round_, self._quorum_id(round_, present), tuple(present), tuple(steps)).encode()
        self.store.compare_set(f"r{round_}/quorum", "", proposal)  # the first proposal stays
        self.store.set("latest", str(round_ + 1))  # the round a replica outside the quorum checks in at

    def _wait_for_min(self, round_: int) -> list[int]:
        """The replicas checked in at round `round_`, once min_replicas have (else a QuorumError)."""
        present = [i for i in range(self.replicas) if self._has(f"r{round_}/in/{i}")]
        start = time.monotonic()
        while len(present) < self.min_replicas:
            if time.monotonic() - start > self.join_timeout:
                raise QuorumError(f"round {round_}: only replicas {present} are alive, fewer than "
                                  f"min_replicas={self.min_replicas}; start more replicas or lower "
                                  "min_replicas")
            time.sleep(POLL)
            present = [i for i in range(self.replicas) if self._has(f"r{round_}/in/{i}")]
        return present

    def _quorum_id(self, round_: int, present: list[int]) -> int:
        """The last round's quorum id where the same members' last collective worked, else a new one."""
        if round_ > 0 and self._has(f"r{round_ - 1}/quorum") and self._has(f"r{round_ - 1}/decision"):
            prev = Quorum.decode(round_ - 1, self.store.get(f"r{round_ - 1}/quorum").decode())
            if prev.members == tuple(present) and self.store.get(f"r{round_ - 1}/decision").decode() != REDO:
                return prev.quorum_id  # the group's last collective worked: keep it
        return round_

    def finish(self, steps: int) -> None:
        """Say that the run is over, after `steps` steps: a replica still outside the quorum then has
        nobody left to heal from, and stops waiting for one (`quorum` raises at once)."""
        self.store.set("finished", str(steps))

    def _check_not_finished(self, step: int) -> None:
        if self._has("finished"):
            done = int(self.store.get("finished"))
            raise QuorumError(f"replica {self.replica} is outside the quorum at step {step}, and the others "
                              f"finished the run ({done} steps) without it: nobody is left to heal from, so "
                              "its weights are not the run's (was it paused or slow for longer than "
                              "heartbeat_timeout near the end?)")

    def decide(self, q: Quorum, vote: str) -> str:
        """Vote `vote` (OK, FAILED or NONFINITE) on round `q.round`'s step and return the round's one
        decision (COMMIT, REDO or SKIP): the first tally stored, the same for every member."""
        if vote not in (OK, FAILED, NONFINITE):
            raise ValueError(f"vote={vote!r} must be one of {OK!r}, {FAILED!r}, {NONFINITE!r}")
        self.store.set(f"r{q.round}/vote/{self.replica}", vote)
        return self.store.compare_set(f"r{q.round}/decision", "", self._tally(q)).decode()

    def should_commit(self, q: Quorum, ok: bool) -> bool:
        """torchft's should_commit: vote ok or failed; True only if the round's decision is to commit."""
        return self.decide(q, OK if ok else FAILED) == COMMIT

    def _tally(self, q: Quorum) -> str:
        """This member's proposal for the decision, from the votes (module docstring, step 3). A member
        that died before voting, or has not voted within the join timeout, makes it REDO."""
        start = time.monotonic()
        while True:
            missing = [m for m in q.members if not self._has(f"r{q.round}/vote/{m}")]
            if not missing:
                votes = {self.store.get(f"r{q.round}/vote/{m}").decode() for m in q.members}
                return COMMIT if votes == {OK} else REDO if FAILED in votes else SKIP
            if not all(self.alive(m) for m in missing) or time.monotonic() - start > self.join_timeout:
                return REDO
            time.sleep(POLL)

    def close(self) -> None:
        self.heartbeat.stop()
