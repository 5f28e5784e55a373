"""Where the sends and receives go in a schedule, and why that order cannot deadlock.

`add_communication` turns per-rank compute orders (F, B and W actions only) into a full `Schedule`;
`check_compute_order` finds compute orders that can never finish, and says which rank waits for what.
"""

from __future__ import annotations

from collections.abc import Sequence

from distlab.pipeline.actions import FLOWS, PLACEMENTS, REQUIRES, Action, Schedule, prerequisites, stage_rank


class DeadlockError(ValueError):
    """The compute order cannot run: some ranks wait for each other in a cycle."""


def add_communication(name: str, orders: Sequence[Sequence[Action]], p: int, m: int, v: int = 1,
                      rendezvous_safe: bool = False, placement: str = "loop") -> Schedule:
    """Turn per-rank compute orders into a full `Schedule`, with every send and receive in place.

    Each send goes right after the F or B that produces its tensor, and each receive right before the F
    or B that needs it. The executor posts every *run* of consecutive sends and receives together and
    waits for the run's receives before computing again: sends never wait (`isend`), so on gloo a rank
    only ever blocks on data it needs next. On NCCL a large send cannot finish before its receive is
    posted, and one pair's messages share a stream, so two neighbours that both send first and receive
    second would hang on the GPU (1F1B's steady state: rank r sends an activation forward while rank r + 1
    sends a gradient back). Posting each run as one `batch_isend_irecv` group lets NCCL progress the
    send and the receive together, as Megatron-LM's `send_forward_recv_backward` does. gloo's support for
    batched groups is weak, so there the executor posts `isend`s and `irecv`s one by one, which is
    equivalent: a gloo `isend` never blocks the caller (gloo's own threads complete it once the peer
    posts its receive), and the executor waits for its sends only at the end of the step.

    That grouping is enough for GPipe and 1F1B, but not for the interleaved schedule with m > p: there
    a rank sends alone to a peer whose own lone send to it comes first. With rendezvous_safe=True
    the order is instead taken from a lock-step run (`_lockstep_lists`), which is safe under the
    strictest semantics at the price of some extra idle time. `validate` checks both with the simulator.

    First the compute order is checked: if no rank can ever run its next compute action, it has a cycle
    of waits (a 1F1B warm-up that is too short, a B before its F), and `DeadlockError` says who waits for
    what. `placement` says where the stages live ("loop": s % p; "v": the V of `actions.stage_rank`).
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r} is not known; use one of {PLACEMENTS}")
    if placement == "v" and v != 2:
        raise ValueError(f"{name}: the V placement puts exactly 2 chunks on each rank, not v={v}; use v=2")
    check_compute_order(name, orders, p, v, placement)
    if rendezvous_safe:
        return Schedule(name, p, m, v, _lockstep_lists(orders, p, v, placement), placement)
    lists = tuple(_with_messages(orders[r], r, p, v, placement) for r in range(p))
    return Schedule(name, p, m, v, lists, placement)


def _with_messages(order: Sequence[Action], r: int, p: int, v: int, placement: str) -> tuple[Action, ...]:
    """Rank r's compute order with each receive right before the action that needs it and each send
    right after the action that produces it."""
    S = p * v
    out: list[Action] = []
    for a in order:
        kind, step = FLOWS.get(a.op, (None, 0))
        prev, nxt = a.stage - step, a.stage + step
        if kind and 0 <= prev < S and stage_rank(prev, p, placement) != r:
            out.append(Action(f"recv_{kind}", a.microbatch, a.stage, peer=stage_rank(prev, p, placement)))
        out.append(Action(a.op, a.microbatch, a.stage))
        if kind and 0 <= nxt < S and stage_rank(nxt, p, placement) != r:
            out.append(Action(f"send_{kind}", a.microbatch, a.stage, peer=stage_rank(nxt, p, placement)))
    return tuple(out)


def _ready_in_lockstep(a: Action, S: int, done: set, have: set) -> bool:
    """Whether `a` can run: its own stage's prerequisites done, the others' messages arrived."""
    for op, mb, s in prerequisites(a, S):
        if s == a.stage and (op, mb, s) not in done:
            return False
        if s != a.stage and (FLOWS[op][0], mb, a.stage) not in have:
            return False
    return True


def _lockstep_lists(orders: Sequence[Sequence[Action]], p: int, v: int,
                    placement: str = "loop") -> tuple[tuple[Action, ...], ...]:
    """Sends and receives in an order that is safe even if every send waits for its receive.

    The compute orders run in lock-step ticks (each rank runs its next compute action if its input is
    there); at the end of a tick every message produced in it is handed over, and the sender's list gets
    the send while the receiver's gets the receive, both at this point. This run is itself a witness
    that every send can meet its receive. Hand-overs are ordered by the sender's parity, so a chain
    r -> r+1 -> r+2 takes two rounds of transfers, not p. The price: a receive can come earlier in a
    rank's list than the compute that needs it, and then the rank waits for it sooner than it must.
    """
    S = p * v
    have: set[tuple[str, int, int]] = set()  # ("fwd"|"bwd", mb, consuming stage) present on its rank
    done: set[tuple[str, int, int]] = set()
    lists: list[list[Action]] = [[] for _ in range(p)]
    pos = [0] * p
    while any(pos[r] < len(orders[r]) for r in range(p)):
        produced, local = [], []
        for r in range(p):
            if pos[r] == len(orders[r]) or not _ready_in_lockstep(orders[r][pos[r]], S, done, have):
                continue
            a = orders[r][pos[r]]
            lists[r].append(Action(a.op, a.microbatch, a.stage))
            done.add((a.op, a.microbatch, a.stage))
            pos[r] += 1
            kind, step = FLOWS.get(a.op, (None, 0))
            if kind and 0 <= a.stage + step < S:
                nxt = a.stage + step
                if stage_rank(nxt, p, placement) == r:
                    local.append((kind, a.microbatch, nxt))
                else:
                    produced.append((r, stage_rank(nxt, p, placement), kind, a.microbatch, a.stage, nxt))
        have.update(local)
        for src, dst, kind, mb, s, nxt in sorted(produced, key=lambda t: (t[0] % 2, t[0], t[1])):
            lists[src].append(Action(f"send_{kind}", mb, s, peer=dst))
            lists[dst].append(Action(f"recv_{kind}", mb, nxt, peer=src))
            have.add((kind, mb, nxt))
    return tuple(tuple(x) for x in lists)


def check_compute_order(name: str, orders: Sequence[Sequence[Action]], p: int, v: int = 1,
                        placement: str = "loop") -> None:
    """Raise `DeadlockError` if the compute orders cannot all finish, whatever the communication.

    Runs the orders in lock-step ticks: in each tick every rank runs its next compute action if its
    prerequisites (`actions.REQUIRES`) ran in an earlier tick. A tick in which no rank can run, with work
    left, is a deadlock.
    """
    if len(orders) != p:
        raise ValueError(f"{name}: got compute orders for {len(orders)} ranks, expected p={p}; "
                         "return one list per rank")
    for r, order in enumerate(orders):
        for i, a in enumerate(order):
            _check_compute_action(name, r, i, a, p, v, placement)
    S = p * v
    done: set[tuple[str, int, int]] = set()
    pos = [0] * p
    while any(pos[r] < len(orders[r]) for r in range(p)):
        ran = _tick(orders, pos, done, S)
        if not ran:
            raise DeadlockError(_deadlock_message(name, orders, pos, done, S))
        done.update(ran)


def _check_compute_action(name: str, r: int, i: int, a: Action, p: int, v: int, placement: str) -> None:
    """Action i of rank r's compute order: a compute op, of a stage that rank r holds."""
    if a.op not in REQUIRES:
        raise ValueError(f"{name}: rank {r}, action {i} has op {a.op!r}; a compute order holds only "
                         f"the ops {sorted(REQUIRES)} (the messages are added by add_communication)")
    if not 0 <= a.stage < p * v or stage_rank(a.stage, p, placement) != r:
        where = ("is not a stage" if not 0 <= a.stage < p * v
                 else f"lives on rank {stage_rank(a.stage, p, placement)}")
        raise ValueError(f"{name}: rank {r}, action {i} ({a.op}{a.microbatch} of stage {a.stage}): "
                         f"stage {a.stage} {where} with p={p}, v={v} and the {placement!r} "
                         "placement; "
                         "a rank runs only the stages it holds")


def _tick(orders: Sequence[Sequence[Action]], pos: list[int], done: set[tuple[str, int, int]],
          S: int) -> list[tuple[str, int, int]]:
    """One lock-step tick: every rank whose next action's prerequisites are done runs it (advancing
    `pos`); the actions that ran."""
    ran = []
    for r, order in enumerate(orders):
        if pos[r] == len(order):
            continue
        a = order[pos[r]]
        if all(need in done for need in prerequisites(a, S)):
            ran.append((a.op, a.microbatch, a.stage))
            pos[r] += 1
    return ran


_WHAT = {"F": "activation", "B": "gradient"}


def _deadlock_message(name: str, orders: Sequence[Sequence[Action]], pos: list[int],
                      done: set[tuple[str, int, int]], S: int) -> str:
    lines = [f"{name}: the compute order deadlocks; every unfinished rank waits:"]
    for r, order in enumerate(orders):
        if pos[r] == len(order):
            continue
        a = order[pos[r]]
        op, mb, s = next(n for n in prerequisites(a, S) if n not in done)
        if s == a.stage:
            why = f"its own {op}{mb} of stage {s}, which comes later or never ({a.op} before {op})"
        else:
            why = f"the {_WHAT.get(op, op + ' output')} of microbatch {mb} from stage {s}"
        lines.append(f"  rank {r} at action {pos[r]} ({a.op}{a.microbatch} of stage {a.stage}) "
                     f"waits for {why}")
    lines.append("A 1F1B rank r must run min(p - r - 1, m) forwards before its first backward: with fewer, "
                 "it waits for a gradient that needs a forward it has not yet done.")
    return "\n".join(lines)
