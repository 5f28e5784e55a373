"""Check a schedule before running it: every F before its B, every send matched by a receive, no deadlock.

A schedule that fails here would hang or compute wrong gradients on real ranks; this finds out on paper,
with a message that names the rank and the action.
"""

from __future__ import annotations

from collections import Counter

from distlab.pipeline.actions import COMM, COMPUTE, Schedule
from distlab.pipeline.communication import DeadlockError
from distlab.pipeline.simulate import message_key, simulate


def validate(schedule: Schedule, backend: str = "gloo") -> None:
    """Raise ValueError (DeadlockError for a deadlock) if `schedule` cannot run correctly on `backend`.

    Checks: each rank's actions are known ops on its own stages; every (microbatch, stage) has exactly
    one F and one B, on the stage's rank, F first; every send has exactly one matching receive on the
    peer; the schedule finishes when sends are buffered (gloo). For "nccl" also: messages between two
    ranks are received in the order they are sent (NCCL ignores tags), and the schedule finishes when a
    send waits for its receive (rendezvous).
    """
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r} is not known; use 'gloo' or 'nccl'")
    p, S, m = schedule.p, schedule.num_stages, schedule.m
    if len(schedule.actions) != p:
        raise ValueError(f"{schedule.name}: {len(schedule.actions)} action lists for p={p} ranks")
    seen: Counter = Counter()
    sends: Counter = Counter()
    recvs: Counter = Counter()
    order: dict[tuple[str, int, int], list] = {}
    for r, actions in enumerate(schedule.actions):
        for i, a in enumerate(actions):
            where = f"{schedule.name}: rank {r}, action {i} ({a})"
            if a.op not in COMPUTE + COMM:
                raise ValueError(f"{where}: op {a.op!r} is not one of {COMPUTE + COMM}")
            if not 0 <= a.microbatch < m or not 0 <= a.stage < S:
                raise ValueError(f"{where}: microbatch must be in 0..{m - 1} and stage in 0..{S - 1}")
            if a.stage % p != r:
                raise ValueError(f"{where}: stage {a.stage} lives on rank {a.stage % p}, not rank {r}")
            if a.op == "B" and seen[("F", a.microbatch, a.stage)] == 0:
                raise ValueError(f"{where}: B{a.microbatch} comes before F{a.microbatch} of stage {a.stage}; "
                                 "a backward needs the activations its forward stashed")
            if a.op in COMPUTE:
                seen[(a.op, a.microbatch, a.stage)] += 1
                continue
            key = message_key(a)
            src, dst = (r, a.peer) if a.op.startswith("send") else (a.peer, r)
            (sends if a.op.startswith("send") else recvs)[(key, src, dst)] += 1
            order.setdefault(("send" if a.op.startswith("send") else "recv", src, dst), []).append(key)
    for mb in range(m):
        for s in range(S):
            for op in COMPUTE:
                if seen[(op, mb, s)] != 1:
                    raise ValueError(f"{schedule.name}: {op}{mb} of stage {s} runs {seen[(op, mb, s)]} times "
                                     f"(on rank {s % p}); every microbatch needs exactly one F and one B "
                                     "per stage")
    for key in sends.keys() | recvs.keys():
        if sends[key] != 1 or recvs[key] != 1:
            (kind, mb, s), src, dst = key
            raise ValueError(f"{schedule.name}: the {kind} message of microbatch {mb} from stage {s} "
                             f"(rank {src} -> rank {dst}) is sent {sends[key]} times and received "
                             f"{recvs[key]} times; each send needs exactly one matching receive")
    simulate(schedule)  # raises DeadlockError if it cannot finish with buffered sends
    if backend == "nccl":
        for (what, src, dst), keys in order.items():
            if what == "send" and keys != order.get(("recv", src, dst)):
                raise ValueError(f"{schedule.name}: rank {src} sends to rank {dst} in the order {keys}, but "
                                 f"rank {dst} receives in another; NCCL matches in order: build the schedule "
                                 "with rendezvous_safe=True")
        try:
            simulate(schedule, rendezvous=True)
        except DeadlockError as e:
            raise DeadlockError(f"{e}. On NCCL a large send waits for its receive: build the schedule with "
                                "rendezvous_safe=True") from e
