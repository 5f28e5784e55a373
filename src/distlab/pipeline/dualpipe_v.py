"""DualPipeV: DeepSeek-V3's DualPipe folded into a V, with forward and backward chunks run in pairs.

DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv 2412.19437), sec. 3.2.1: DualPipe feeds
micro-batches from both ends of the pipeline and, in the steady state, runs a forward chunk of one
micro-batch together with a backward chunk of another ("F&B"). Inside such a pair the two chunks'
computation and communication interleave, so the all-to-alls of expert parallelism and the pipeline's
own sends of one chunk hide behind the other chunk's matrix products. DualPipe keeps two copies of the
weights; its "cut-in-half" form, DualPipeV (DeepSeek's DualPipe repository; PyTorch's
`ScheduleDualPipeV`), keeps one: the V placement of ZB-V (Qi et al. 2024), rank r holding stage r on the
way down and stage 2p - 1 - r on the way up, so the micro-batches of the second chunk run "the other way"
through the same ranks.

Rank r of p, on n micro-batches (n >= 2p), with chunk 0 = stage r and chunk 1 = stage 2p - 1 - r:
1. 2 (p - r - 1) forwards of chunk 0: the warm-up until micro-batch 0 turns at the bottom of the V;
2. r + 1 pairs F0, F1 (forward of both chunks);
3. p - r - 1 rounds B1, W1, F1: the first input gradients of chunk 1, their W at once (zero bubble);
4. the steady state, n - 2p + r + 1 rounds of two pairs: (F0 & B1) then (F1 & B0), each B a full
   backward (input and weight gradient); the last rank runs its first F0 and B1 apart, since its B1
   waits on that F0's own output going through chunk 1;
5. p - r - 1 rounds B1, (F1 & B0): chunk 0 has no forwards left;
6. r + 1 rounds B1, B0, switching to input-gradient-only B's half-way (zero bubble: the W's wait);
7. p - r - 1 rounds W, B0 (the oldest owed W, then an input gradient);
8. the r + 1 W's still owed.

A full backward is written here as B immediately followed by its W (the same computation as one
backward pass), so DualPipeV is data in the vocabulary of `actions`. The pairs are kept as *slots*
(`dualpipev_slots`): a slot of more than one compute action is an overlapped F & B, and
`dualpipev_schedule` posts the receives of both halves before it and the sends of both after it, as
torch's runtime does for its OVERLAP_F_B action, so one half's messages travel while the other computes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch.distributed as dist
from torch import Tensor

from distlab.pipeline.actions import FLOWS, Action, Schedule, check_sizes, stage_rank
from distlab.pipeline.communication import add_communication, check_compute_order
from distlab.pipeline.simulate import simulate, timeline_stats

Slot = tuple[Action, ...]


def check_dualpipev(p: int, m: int) -> None:
    """A ValueError naming m unless there are at least 2p micro-batches (one per stage)."""
    check_sizes(p, m)
    if m < 2 * p:
        raise ValueError(f"m={m} micro-batches: DualPipeV needs at least one per stage, m >= 2p = {2 * p} "
                         f"(torch's ScheduleDualPipeV refuses fewer too); use m={2 * p} or more, or 'zbv', "
                         "which accepts any m")


class _Rank:
    """The order of one rank as it is written down: counters per (op, stage) and the owed W's."""

    def __init__(self, p: int, r: int) -> None:
        self.down, self.up = r, 2 * p - 1 - r  # chunk 0 and chunk 1
        self.next: dict[tuple[str, int], int] = {}
        self.owed: deque[Action] = deque()  # input gradients whose W has not run, oldest first
        self.slots: list[Slot] = []

    def _take(self, op: str, stage: int) -> Action:
        mb = self.next.get((op, stage), 0)
        self.next[(op, stage)] = mb + 1
        return Action(op, mb, stage)

    def forward(self, stage: int) -> Slot:
        return (self._take("F", stage),)

    def backward(self, stage: int, full: bool = True) -> Slot:
        """A full backward (B and its W at once) or an input-gradient B whose W is owed."""
        b = self._take("B", stage)
        if full:
            return b, Action("W", b.microbatch, stage)
        self.owed.append(Action("W", b.microbatch, stage))
        return (b,)

    def weight(self) -> Slot:
        return (self.owed.popleft(),) if self.owed else ()

    def add(self, *slots: Slot) -> None:
        self.slots += [s for s in slots if s]


def _rank_slots(p: int, m: int, r: int) -> list[Slot]:
    k = _Rank(p, r)
    down, up = k.down, k.up
    for _ in range(2 * (p - r - 1)):                            # 1. warm-up of chunk 0
        k.add(k.forward(down))
    for _ in range(r + 1):                                      # 2. F0 F1
        k.add(k.forward(down), k.forward(up))
    for _ in range(p - r - 1):                                  # 3. B1 W1 F1
        k.add(k.backward(up, full=False), k.weight(), k.forward(up))
    for i in range(m - 2 * p + r + 1):                          # 4. (F0 & B1) (F1 & B0)
        if i == 0 and r == p - 1:
            k.add(k.forward(down), k.backward(up))
        else:
            k.add(k.forward(down) + k.backward(up))
        k.add(k.forward(up) + k.backward(down))
    for _ in range(p - r - 1):                                  # 5. B1 (F1 & B0)
        k.add(k.backward(up), k.forward(up) + k.backward(down))
    _cool_down(k, p, r)
    return k.slots


def _cool_down(k: _Rank, p: int, r: int) -> None:
    """Phases 6 to 8 of rank r's slots: the backwards left, the zero-bubble B/W split, the owed W's."""
    down, up = k.down, k.up
    zero_bubble = False
    for i in range(r + 1):                                      # 6. B1 B0, zero bubble from half-way
        zero_bubble |= i == (r + 1) // 2 and r % 2 == 1
        k.add(k.backward(up, full=not zero_bubble))
        zero_bubble |= i == (r + 1) // 2 and r % 2 == 0
        k.add(k.backward(down, full=not zero_bubble))
    for _ in range(p - r - 1):                                  # 7. W B0
        k.add(k.weight(), k.backward(down, full=not zero_bubble))
    for _ in range(r + 1):                                      # 8. the W's still owed
        k.add(k.weight())


def dualpipev_slots(p: int, m: int) -> list[list[Slot]]:
    """Per rank, its compute in slots: (F,), (B,), (W,), a full backward (B, W), or an overlapped pair
    (F, B, W) of a forward and a full backward of two different micro-batches (DeepSeek-AI 2024)."""
    check_dualpipev(p, m)
    return [_rank_slots(p, m, r) for r in range(p)]


def dualpipev_order(p: int, m: int) -> list[list[Action]]:
    """Per rank, the compute order of DualPipeV (the slots one after the other)."""
    return [[a for slot in slots for a in slot] for slots in dualpipev_slots(p, m)]


def pairs(p: int, m: int) -> list[int]:
    """Overlapped F & B pairs per rank."""
    return [sum(len(s) == 3 for s in slots) for slots in dualpipev_slots(p, m)]


def dualpipev_schedule(p: int, m: int, rendezvous_safe: bool = False) -> Schedule:
    """DualPipeV for p ranks and m >= 2p micro-batches, two chunks per rank in the V placement.

    Each slot's receives are posted before it and its sends after it, so an overlapped pair posts the
    activation it needs and the gradient it needs together, and sends its two results together. With
    rendezvous_safe=True (NCCL's strict sends) the messages come from `add_communication`'s lock-step
    placement instead, which is safe under any send semantics."""
    slots = dualpipev_slots(p, m)
    orders = [[a for slot in rank_slots for a in slot] for rank_slots in slots]
    if rendezvous_safe:
        return add_communication("dualpipev", orders, p, m, 2, True, "v")
    check_compute_order("dualpipev", orders, p, 2, "v")
    lists = tuple(tuple(a for slot in rank_slots for a in _slot_with_messages(slot, r, p))
                  for r, rank_slots in enumerate(slots))
    return Schedule("dualpipev", p, m, 2, lists, "v")


def _slot_with_messages(slot: Slot, r: int, p: int) -> list[Action]:
    """Rank r's slot with the receives its actions need posted before it and their sends after it."""
    recvs, sends = [], []
    for a in slot:
        kind, step = FLOWS.get(a.op, (None, 0))
        prev, nxt = a.stage - step, a.stage + step
        if kind and 0 <= prev < 2 * p and stage_rank(prev, p, "v") != r:
            recvs.append(Action(f"recv_{kind}", a.microbatch, a.stage, peer=stage_rank(prev, p, "v")))
        if kind and 0 <= nxt < 2 * p and stage_rank(nxt, p, "v") != r:
            sends.append(Action(f"send_{kind}", a.microbatch, a.stage, peer=stage_rank(nxt, p, "v")))
    return recvs + [Action(a.op, a.microbatch, a.stage) for a in slot] + sends


# ---- the pairs in the simulator: what the overlap hides ----------------------------------------------

def overlapped_duration(p: int, m: int, t_f: float, t_b: float, t_w: float,
                        t_c: float) -> Callable[[int, Action], float]:
    """`simulate`'s duration of each compute action of DualPipeV when every F and every B chunk also
    carries t_c of its own communication (expert parallelism's dispatch and combine all-to-alls in
    DeepSeek-V3) that it cannot overlap alone: a chunk alone takes t_f + t_c (or t_b + t_c); in an F & B
    pair each half's t_c runs under the other's compute, as long as t_c <= the other's time, so the pair
    takes t_f + t_b + max(0, t_c - t_b) + max(0, t_c - t_f) (DeepSeek-AI 2024, sec. 3.2.1, fig. 4)."""
    paired = {(r, a) for r, slots in enumerate(dualpipev_slots(p, m)) for s in slots if len(s) == 3
              for a in s[:2]}

    def duration(r: int, a: Action) -> float:
        if a.op == "W":
            return t_w
        if (r, a) in paired:
            return t_f + max(0.0, t_c - t_b) if a.op == "F" else t_b + max(0.0, t_c - t_f)
        return (t_f if a.op == "F" else t_b) + t_c

    return duration


@dataclass(frozen=True)
class Comparison:
    """DualPipeV beside ZB-V in the simulator, both on p ranks, m micro-batches and the V placement."""

    name: str
    makespan: float
    bubble: float  # mean over ranks of 1 - (F, B and W work) / makespan: idle and exposed t_c together
    peak_stash: tuple[int, ...]


def compare_with_zbv(p: int, m: int, t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0,
                     t_c: float = 0.0, t_comm: float = 0.0) -> list[Comparison]:
    """Simulate ZB-V (every chunk exposes its t_c) and DualPipeV (pairs hide it); times per chunk."""
    from distlab.pipeline.schedules import zbv_schedule

    work = 2 * m * (t_f + t_b + t_w)  # per rank: m micro-batches x 2 chunks
    out = []
    for name, schedule, duration in (
            ("zbv", zbv_schedule(p, m), lambda r, a: {"F": t_f + t_c, "B": t_b + t_c, "W": t_w}[a.op]),
            ("dualpipev", dualpipev_schedule(p, m), overlapped_duration(p, m, t_f, t_b, t_w, t_c))):
        stats = timeline_stats(simulate(schedule, t_f, t_b, t_comm, t_w=t_w, duration=duration), p)
        out.append(Comparison(name, stats.makespan, 1 - work / stats.makespan, stats.peak_stash))
    return out


# ---- beside torch.distributed.pipelining.ScheduleDualPipeV -------------------------------------------

def torch_dualpipev_order(p: int, m: int) -> list[list[Action]]:
    """torch's ScheduleDualPipeV order for p ranks and m micro-batches, built without stages (as
    `torch_orders` does for ZB-V) and written in our vocabulary: F -> F, I (input gradient) -> B, W -> W,
    a FULL_BACKWARD -> B then W, an OVERLAP_F_B -> its sub-actions in order. Private torch names, pinned
    by the tests."""
    from torch.distributed.pipelining import schedules

    check_dualpipev(p, m)
    sched = object.__new__(schedules.ScheduleDualPipeV)  # no stages, no process group
    sched.pp_group_size, sched._n_microbatches = p, m
    sched.num_stages, sched.n_local_stages = 2 * p, 2
    orders = []
    for r in range(p):
        acts: list[Action] = []
        for a in sched._calculate_single_rank_operations(r):
            for s in (a.sub_actions or (a,)) if a is not None else ():
                kind = str(s.computation_type.value)
                ops = {"F": ("F",), "I": ("B",), "W": ("W",), "B": ("B", "W")}.get(kind)
                if ops is None:
                    raise ValueError(f"rank {r}: torch action {s} ({kind}) has no distlab counterpart")
                acts += [Action(op, s.microbatch_index, s.stage_index) for op in ops]
        orders.append(acts)
    return orders


def steps_on_rank(runs: Sequence[tuple[str, int]], sizes: Sequence[int], X: Tensor, y: Tensor,
                  group: dist.ProcessGroup | None = None, seed: int = 0, lr: float = 0.1) -> list:
    """Run on every rank of the pipeline's `group`: one SGD step of MLP(sizes) per (name, m) in `runs`,
    name "dualpipev" or "zbv", with `train.pipeline_step` (the same stages, executor and reference as
    chapter 4's other schedules). Returns the `train.StepResult`s."""
    from distlab import launch
    from distlab.pipeline.schedules import zbv_schedule
    from distlab.pipeline.train import pipeline_step

    p = dist.get_world_size(group) if dist.is_initialized() else 1
    safe = dist.is_initialized() and dist.get_backend(group) == "nccl"
    build = {"dualpipev": dualpipev_schedule, "zbv": zbv_schedule}
    device = launch.device() if dist.is_initialized() else None
    return [pipeline_step(sizes, X, y, build[name](p, m, safe), group, seed, lr, device=device)
            for name, m in runs]
