"""One executor for every schedule: run a rank's list of actions on its stages, timing each action.

GPipe, 1F1B and interleaved 1F1B differ only in their lists of actions (`schedules`), so one small loop
runs them all. `StageRunner` holds this rank's `Stage`s (module and stashes), the data, and its
`PointToPoint` messages in the pipeline's group, and walks `schedule.actions[rank]`:
- a compute action goes to the handler of its op, `StageRunner.compute[op]` (F: `forward`, B:
  `backward`, W: `weight`, the weight-gradient pass of zero-bubble schedules, Qi et al. 2023; when a
  schedule has W's, its stages split their backward, see `stage.Stage`);
- a run of consecutive send and receive actions is posted together (`communicate`), then its receives
  are waited for (see `communication.add_communication` for why that order cannot deadlock).

Every action is timed with `time.perf_counter` (after a CUDA synchronize on GPUs), relative to the moment
the rank leaves a barrier of the group, so that the ranks' timelines line up to within the barrier's exit
skew and can be drawn next to the simulated one. The schedule is checked by `validate` before it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.pipeline.actions import COMPUTE, Action, Schedule
from distlab.pipeline.p2p import Message, PointToPoint
from distlab.pipeline.simulate import Event
from distlab.pipeline.stage import Stage
from distlab.pipeline.validate import validate


@dataclass
class RankRun:
    """What one rank saw in one step: per-microbatch losses (last stage only), the timed actions, and
    the peak stash: most microbatch-stage pairs held at once, and the bytes autograd saved for them."""

    losses: dict[int, float]
    events: list[Event]
    peak_stash: int
    peak_stash_bytes: int


def message_tag(a: Action, schedule: Schedule) -> int:
    """A tag unique to the message a send or receive moves (the producing stage names it)."""
    kind = a.op.split("_")[1]
    stage = a.stage if a.op.startswith("send") else (a.stage - 1 if kind == "fwd" else a.stage + 1)
    return ((kind == "bwd") * schedule.num_stages + stage) * schedule.m + a.microbatch


def runs(actions: Sequence[Action]) -> list[list[Action]]:
    """Cut a rank's list into single compute actions and maximal runs of consecutive messages."""
    out: list[list[Action]] = []
    for a in actions:
        if a.op not in COMPUTE and out and out[-1][0].op not in COMPUTE:
            out[-1].append(a)
        else:
            out.append([a])
    return out


class StageRunner:
    """This rank's part of a pipelined step: its stages, the data they need, and its messages."""

    def __init__(self, schedule: Schedule, stages: dict[int, Stage], microbatches: Sequence[Tensor] | None,
                 targets: Sequence[Tensor] | None, input_shapes: dict[int, torch.Size], rank: int,
                 group: dist.ProcessGroup | None, device: torch.device, dtype: torch.dtype) -> None:
        self.schedule, self.stages, self.rank, self.device, self.dtype = schedule, stages, rank, device, dtype
        self.microbatches, self.targets, self.input_shapes = microbatches, targets, input_shapes
        self.p2p = PointToPoint(group) if dist.is_initialized() else None
        self.events: list[Event] = []
        self.peak = self.peak_bytes = 0
        self.compute: dict[str, Callable[[Action], None]] = {"F": self.forward, "B": self.backward,
                                                             "W": self.weight}

    # ---- compute: one handler per op --------------------------------------------------------------

    def forward(self, a: Action) -> None:
        stage = self.stages[a.stage]
        if stage.is_first:
            x = self.microbatches[a.microbatch].to(self.device)
        elif a.stage - 1 in self.stages:  # the previous stage ran on this rank (p = 1)
            x = self.stages[a.stage - 1].activation(a.microbatch)
        else:
            x = stage.inputs[a.microbatch]  # received by recv_fwd
        target = self.targets[a.microbatch].to(self.device) if stage.is_last else None
        stage.forward(a.microbatch, x, target)

    def backward(self, a: Action) -> None:
        stage = self.stages[a.stage]
        if not stage.is_last and a.stage + 1 in self.stages:  # the next stage ran on this rank
            stage.grad_outputs[a.microbatch] = self.stages[a.stage + 1].input_gradient(a.microbatch)
        stage.backward(a.microbatch)

    def weight(self, a: Action) -> None:
        self.stages[a.stage].backward_weight(a.microbatch)

    # ---- communication: a run of sends and receives ------------------------------------------------

    def _message(self, a: Action) -> Message:
        """The tensor a message action sends, or a fresh buffer (stashed on its stage) to receive into."""
        stage, tag = self.stages[a.stage], message_tag(a, self.schedule)
        if a.op.startswith("send"):
            t = stage.activation(a.microbatch) if a.op == "send_fwd" else stage.input_gradient(a.microbatch)
            return Message(t, a.peer, tag, True)
        shape = self.input_shapes[a.stage + (a.op == "recv_bwd")]
        buffer = torch.empty(shape, device=self.device, dtype=self.dtype)
        (stage.inputs if a.op == "recv_fwd" else stage.grad_outputs)[a.microbatch] = buffer
        return Message(buffer, a.peer, tag, False)

    def communicate(self, run: list[Action]) -> None:
        start = self._now()
        works = self.p2p.post([self._message(a) for a in run])
        posted = self._now()  # a send's event lasts until it is posted; on gloo it does not wait for the peer
        for w in works:
            w.wait()
        end = self._now()
        self.events.extend(Event(self.rank, a, start, end if a.op.startswith("recv") else posted)
                           for a in run)

    # ---- the loop ---------------------------------------------------------------------------------

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def run(self) -> RankRun:
        """Run this rank's actions in order; return its losses, timed events and peak stash."""
        if self.p2p is not None:
            dist.barrier(group=self.p2p.group)
        t0 = self._now()
        for run in runs(self.schedule.actions[self.rank]):
            if run[0].op in COMPUTE:
                start = self._now()
                self.compute[run[0].op](run[0])
                self.events.append(Event(self.rank, run[0], start, self._now()))
                self.peak = max(self.peak, sum(s.stashed for s in self.stages.values()))
                self.peak_bytes = max(self.peak_bytes, sum(s.stashed_bytes for s in self.stages.values()))
            else:
                self.communicate(run)
        if self.p2p is not None:
            self.p2p.finish()
        losses = {mb: loss for s in self.stages.values() for mb, loss in s.losses.items()}
        events = [Event(e.rank, e.action, e.start - t0, e.end - t0) for e in self.events]
        return RankRun(losses, events, self.peak, self.peak_bytes)


def run_schedule(schedule: Schedule, stages: dict[int, nn.Module], microbatches: Sequence[Tensor] | None,
                 targets: Sequence[Tensor] | None, loss_fn: Callable[[Tensor, Tensor], Tensor],
                 input_shapes: dict[int, torch.Size], group: dist.ProcessGroup | None = None,
                 device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> RankRun:
    """Run this rank's actions of `schedule` on its `stages` ({stage index: module}), in the pipeline's
    process `group` (None: the whole world; without torch.distributed, one rank).

    This rank is position `dist.get_rank(group)` of the group, and runs `schedule.actions` of that
    position. `microbatches` (inputs) are needed on the rank of stage 0 and `targets` on the rank of the
    last stage; `input_shapes[s]` is the shape of stage s's input for one microbatch. Gradients
    accumulate in the stages' parameters' `.grad`; the caller applies the optimizer. The schedule runs
    as GPipe (Huang et al. 2019), 1F1B or interleaved 1F1B (Narayanan et al. 2019, 2021) prescribe.
    Its messages are posted in the order of this rank's send and receive actions, so a
    `distlab.comm_log` open around the call sees the k-th send action as the k-th send (chapter 9 counts
    the pipeline's bytes that way).
    """
    rank = pipeline_position(schedule, group)
    _check_stages(schedule, stages, input_shapes, rank)
    if 0 in stages:
        _check_microbatches("microbatches", microbatches, schedule.m)
    if schedule.num_stages - 1 in stages:
        _check_microbatches("targets", targets, schedule.m)
    validate(schedule, "nccl" if dist.is_initialized() and dist.get_backend(group) == "nccl" else "gloo")
    split = schedule.split_backward
    mine = {s: Stage(s, module, schedule.num_stages, schedule.m, loss_fn, split)
            for s, module in stages.items()}
    runner = StageRunner(schedule, mine, microbatches, targets, input_shapes, rank, group,
                         device or torch.device("cpu"), dtype)
    return runner.run()


# --------------------------------------------------------------------------------------------------
# Checking the inputs: each of these would otherwise hang, or train on wrong gradients without a word
# --------------------------------------------------------------------------------------------------

def pipeline_position(schedule: Schedule, group: dist.ProcessGroup | None) -> int:
    """This rank's position in the pipeline's `group` (None: the whole world; 0 without
    torch.distributed), checked against the schedule's number of ranks."""
    if isinstance(group, int):
        raise TypeError(f"group={group!r}: a pipeline takes its ProcessGroup (None for the whole "
                        "world), not a rank; this rank's position is dist.get_rank(group)")
    if not dist.is_initialized():
        if group is not None:
            raise ValueError("group was given but torch.distributed is not initialised; start the ranks "
                             "with distlab.launch.run or torchrun")
        size, rank = 1, 0
    else:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if rank < 0:
            raise ValueError(f"rank {dist.get_rank()} is not in the group it was given; call run_schedule "
                             "only on the ranks of the pipeline's group")
    if schedule.p != size:
        raise ValueError(f"schedule {schedule.name!r} is for p={schedule.p} ranks, but the group has {size}; "
                         f"build the schedule with p={size} (dist.get_world_size(group))")
    return rank


def _check_stages(schedule: Schedule, stages: dict[int, nn.Module], input_shapes: dict[int, torch.Size],
                  rank: int) -> None:
    S = schedule.num_stages
    want = [s for s in range(S) if schedule.rank_of(s) == rank]
    if sorted(stages) != want:
        raise ValueError(f"stages={sorted(stages)} on rank {rank}, but {schedule.name!r} with "
                         f"p={schedule.p}, v={schedule.v} runs stages {want} there; pass one module for each")
    needed = {s for s in want if s > 0} | {s + 1 for s in want if s < S - 1}
    missing = sorted(needed - set(input_shapes))
    if missing:
        raise ValueError(f"input_shapes has no shape for stage(s) {missing}: a rank must know the shape "
                         "of every tensor it receives; pass partition.boundary_shapes(...) as a dict")


def _check_microbatches(name: str, xs: Sequence[Tensor] | None, m: int) -> None:
    """m non-empty microbatches of one size: each loss is divided by m, which gives the batch's mean
    loss only when every microbatch has the same number of samples."""
    if xs is None or len(xs) != m:
        got = "None" if xs is None else f"{len(xs)} microbatches"
        raise ValueError(f"{name}: got {got} for a schedule with m={m}; cut the batch with "
                         f"train.split_microbatches(X, y, {m})")
    sizes = sorted({len(x) for x in xs})
    if sizes[0] == 0:
        raise ValueError(f"{name}: a microbatch is empty; use a batch of at least m={m} samples")
    if len(sizes) > 1:
        raise ValueError(f"{name}: microbatch sizes {sizes} differ, so the mean of their losses is not the "
                         "batch's mean loss; cut the batch into m equal parts (a batch size divisible by m)")
