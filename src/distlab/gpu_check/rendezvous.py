"""Can these per-rank orders of messages and collectives deadlock when every send waits for its receive?

gloo buffers a send: `isend` returns at once and gloo's threads deliver the message whenever the peer
posts its receive, so an order in which two neighbours both send first and receive second runs fine on
CPU. NCCL does not buffer: a send larger than its internal buffers cannot complete before its receive is
posted (rendezvous semantics), one pair's messages are matched in the order they were issued, with no
tags, and a collective completes only when every rank of its group has called the same collective
(NVIDIA, NCCL User Guide, "Point-to-point communication" and "Group calls"). So an order that is fine
on gloo can hang on the first GPU node. This file finds out on paper, with no ranks and no GPU.

A *program* is, for each rank, the list of its *steps*; a step is one `Op`, or a tuple of ops posted
together as one `batch_isend_irecv` group (`ncclGroupStart/End`), which progress together and complete
together. `check(program)` runs it under the strictest semantics:
- a rank posts every op of its current step and waits until all of them have completed;
- the k-th send from rank a to rank b matches the k-th receive at b from a (in order, no tags), and both
  complete once both are posted; their `key`s (what the message is: a name, a shape) must agree;
- the k-th collective on a group completes once every member has posted its k-th one, and all of them
  must be the same collective (`name`); a receive from any source (`peer=None`) does not exist on NCCL.
It returns the list of `Finding`s (empty: the order is safe on every backend). `pipeline_program` turns
a chapter 4 schedule into a program exactly as its executor posts it (`pipeline.p2p`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from distlab.pipeline.actions import COMPUTE, Schedule, message_key
from distlab.pipeline.executor import runs


@dataclass(frozen=True)
class Op:
    """One communication call of one rank: "send" or "recv" to or from `peer` (a rank of the program;
    None: any source), or a "collective" called `name` on the ranks `group`. `key` says what the
    message or buffer is; the two sides of a message must give equal keys."""

    kind: str
    peer: int | None = None
    key: Hashable = None
    name: str = ""
    group: tuple[int, ...] = ()

    def __str__(self) -> str:
        if self.kind == "collective":
            return f"{self.name} on ranks {list(self.group)}"
        arrow = "to" if self.kind == "send" else "from"
        return f"{self.kind} {self.key} {arrow} rank {'any' if self.peer is None else self.peer}"


@dataclass(frozen=True)
class Finding:
    """One broken rule: `rule` is "any-source", "unmatched", "order", "mismatch" or "deadlock"."""

    rule: str
    message: str


Step = "Op | tuple[Op, ...]"
Program = Sequence[Sequence["Op | tuple[Op, ...]"]]


def _steps(program: Program) -> list[list[tuple[Op, ...]]]:
    kinds = ("send", "recv", "collective")
    out = []
    for r, steps in enumerate(program):
        mine = []
        for i, step in enumerate(steps):
            ops = tuple(step) if isinstance(step, (tuple, list)) else (step,)
            for op in ops:
                if not isinstance(op, Op) or op.kind not in kinds:
                    raise ValueError(f"program[{r}][{i}] holds {op!r}; a step is an Op of kind {kinds} "
                                     "or a tuple of them posted together")
            mine.append(ops)
        out.append(mine)
    return out


def _match(steps: list[list[tuple[Op, ...]]]) -> tuple[dict, list[Finding]]:
    """Pair every op with its partners: {(rank, step, index): [(rank, step, index), ...]}."""
    p, findings = len(steps), []
    sends: dict[tuple[int, int], list] = {}
    recvs: dict[tuple[int, int], list] = {}
    colls: dict[tuple[int, ...], dict[int, list]] = {}
    for r, mine in enumerate(steps):
        for s, ops in enumerate(mine):
            for i, op in enumerate(ops):
                where = (r, s, i)
                if op.kind == "collective":
                    colls.setdefault(op.group, {}).setdefault(r, []).append((where, op))
                elif op.peer is None:
                    findings.append(Finding("any-source", f"rank {r}, step {s}: {op}; NCCL has no receive "
                                            "from any source: name the sender (src=...)"))
                elif not 0 <= op.peer < p or op.peer == r:
                    findings.append(Finding("unmatched", f"rank {r}, step {s}: {op}: no such peer in a "
                                            f"program of {p} ranks"))
                elif op.kind == "send":
                    sends.setdefault((r, op.peer), []).append((where, op))
                else:
                    recvs.setdefault((op.peer, r), []).append((where, op))
    partners: dict[tuple[int, int, int], list] = {}
    for pair in sorted(set(sends) | set(recvs)):
        _match_messages(pair, sends.get(pair, []), recvs.get(pair, []), partners, findings)
    for group, by_rank in colls.items():
        _match_collectives(group, by_rank, partners, findings)
    return partners, findings


def _match_messages(pair: tuple[int, int], out: list, into: list, partners: dict,
                    findings: list[Finding]) -> None:
    """The k-th send from pair[0] to pair[1] meets the k-th receive at pair[1] from pair[0]."""
    if len(out) != len(into):
        findings.append(Finding("unmatched", f"rank {pair[0]} sends {len(out)} messages to rank "
                                f"{pair[1]}, which receives {len(into)} from it; every send needs one"))
    for (w_s, o_s), (w_r, o_r) in zip(out, into, strict=False):
        if o_s.key != o_r.key:
            findings.append(Finding("order", f"rank {pair[0]}'s message {o_s.key} to rank {pair[1]} "
                                    f"meets the receive for {o_r.key} (step {w_r[1]}): NCCL matches a "
                                    "pair's messages in the order they are posted, without tags"))
        partners[w_s], partners[w_r] = [w_r], [w_s]


def _match_collectives(group: tuple[int, ...], by_rank: dict[int, list], partners: dict,
                       findings: list[Finding]) -> None:
    counts = {r: len(by_rank.get(r, [])) for r in group}
    if len(set(counts.values())) > 1:
        findings.append(Finding("mismatch", f"the ranks of group {list(group)} call {counts} collectives on "
                                "it; every rank of a group must call the same ones"))
    for k in range(min(counts.values())):
        calls = [by_rank[r][k] for r in group]
        names = {r: op.name for r, (_, op) in zip(group, calls, strict=True)}
        if len(set(names.values())) > 1:
            findings.append(Finding("mismatch", f"collective #{k} on group {list(group)} is {names}; "
                                    "NCCL needs the same collective in the same order on every rank"))
        for where, _ in calls:
            partners[where] = [w for w, _ in calls if w != where]


def check(program: Program, run: bool = True) -> list[Finding]:
    """Every broken NCCL rule of `program` (see the module docstring); [] if it runs on any backend.
    `run=False` checks only how the calls pair up (any source, unmatched, order, mismatch), for calls
    whose blocking is not known (a log records the calls, not when the rank waited for them)."""
    steps = _steps(program)
    partners, findings = _match(steps)
    if findings or not run:
        return findings  # a program whose messages do not pair up has no meaningful run
    return _rendezvous(steps, partners)


def _rendezvous(steps: list[list[tuple[Op, ...]]], partners: dict) -> list[Finding]:
    """Run the ranks in rounds: every op posted on all its sides completes, then every rank whose step has
    completed moves on; a round in which no rank moves is a deadlock."""
    pos, done = [0] * len(steps), set()
    while any(pos[r] < len(steps[r]) for r in range(len(steps))):
        _complete_posted(steps, pos, partners, done)
        if not _advance(steps, pos, done):
            return [_deadlock(steps, pos)]
    return []


def _complete_posted(steps: list[list[tuple[Op, ...]]], pos: list[int], partners: dict, done: set) -> None:
    """Mark done every op of a rank's current step whose partners are all at their own (posted)."""
    for r, mine in enumerate(steps):
        if pos[r] == len(mine):
            continue
        for i in range(len(mine[pos[r]])):
            w = (r, pos[r], i)
            if w not in done and all(pos[o[0]] == o[1] for o in partners[w]):
                done.update([w, *partners[w]])  # posted on every side: completes everywhere


def _advance(steps: list[list[tuple[Op, ...]]], pos: list[int], done: set) -> bool:
    """Move every rank whose current step is done to its next; whether any rank moved."""
    moved = False
    for r, mine in enumerate(steps):
        if pos[r] < len(mine) and all((r, pos[r], i) in done for i in range(len(mine[pos[r]]))):
            pos[r], moved = pos[r] + 1, True
    return moved


def _deadlock(steps: list[list[tuple[Op, ...]]], pos: list[int]) -> Finding:
    """The deadlock finding: what each rank that has not finished waits in."""
    waits = [f"rank {r} at step {pos[r]} waits in {' + '.join(map(str, mine[pos[r]]))}"
             for r, mine in enumerate(steps) if pos[r] < len(mine)]
    return Finding("deadlock", "deadlock under rendezvous semantics (a send waits for its receive): "
                   + "; ".join(waits))


def pipeline_program(schedule: Schedule, batched: bool = True) -> list[list[tuple[Op, ...]]]:
    """`schedule`'s messages as the executor posts them: each run of consecutive sends and receives as one
    `batch_isend_irecv` group (`batched=True`, what `pipeline.p2p` does on NCCL), or one blocking call at
    a time (`batched=False`). Compute waits on no peer, so it leaves no step."""
    program = []
    for actions in schedule.actions:
        steps: list[tuple[Op, ...]] = []
        for run in runs(actions):
            if run[0].op in COMPUTE:
                continue
            ops = tuple(Op("send" if a.op.startswith("send") else "recv", a.peer, message_key(a))
                        for a in run)
            steps.extend([ops] if batched else [(op,) for op in ops])
        program.append(steps)
    return program
