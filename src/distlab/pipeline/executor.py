"""One executor for every schedule: run a rank's list of actions on its stages, timing each action.

`run_schedule` walks `schedule.actions[rank]` in order (GPipe, 1F1B and interleaved differ only in that
list) and keeps four dictionaries keyed by (microbatch, stage):
- `inputs`: the tensor a stage's forward started from (received, or the previous local stage's output
  detached), with `requires_grad` so that its gradient can be sent back;
- `outputs`: what the forward produced (for the last stage: the loss of that microbatch, divided by m,
  so that the gradients add up to those of the mean loss over the whole batch);
- `grad_outputs`: the gradient of a stage's output, received from the next stage;
- `grad_inputs`: the gradient of a stage's input, computed by its backward, to be sent back.
A backward frees its microbatch's stash, which is what makes 1F1B's memory bounded.

Communication: each run of consecutive send/recv actions is posted together, then the receives are
waited for (see `schedules.add_communication`). On gloo, sends are `isend`s, kept until the end of the
step, and every message carries its own tag, so two messages between the same ranks cannot be mixed up.
On NCCL, which ignores tags and matches messages between two ranks in order, the run is posted as one
`batch_isend_irecv` group and the schedule must pass `validate(schedule, backend="nccl")` (build it with
rendezvous_safe=True). Every action is timed with `time.perf_counter` (after a CUDA synchronize on
GPUs), relative to the moment the rank leaves a barrier, so that the ranks' timelines line up to within
the barrier's exit skew and can be drawn next to the simulated one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.pipeline.actions import Action, Schedule
from distlab.pipeline.simulate import Event
from distlab.pipeline.validate import validate


@dataclass
class RankRun:
    """What one rank saw in one step: per-microbatch losses (last stage only), the timed actions, and
    the peak stash: most microbatch-stage pairs held at once, and the bytes autograd saved for them."""

    losses: dict[int, float]
    events: list[Event]
    peak_stash: int
    peak_stash_bytes: int


def _tag(a: Action, schedule: Schedule, sending: bool) -> int:
    """A tag unique to the message an action moves (the producing stage names it)."""
    kind = a.op.split("_")[1]
    stage = a.stage if sending else (a.stage - 1 if kind == "fwd" else a.stage + 1)
    return ((kind == "bwd") * schedule.num_stages + stage) * schedule.m + a.microbatch


def run_schedule(schedule: Schedule, stages: dict[int, nn.Module], microbatches: Sequence[Tensor] | None,
                 targets: Sequence[Tensor] | None, loss_fn: Callable[[Tensor, Tensor], Tensor],
                 input_shapes: dict[int, torch.Size], rank: int, device: torch.device | None = None,
                 dtype: torch.dtype = torch.float32) -> RankRun:
    """Run this rank's actions of `schedule` on its `stages` ({stage index: module}).

    `microbatches` (inputs) are needed on the rank of stage 0 and `targets` on the rank of the last stage;
    `input_shapes[s]` is the shape of stage s's input for one microbatch. Gradients accumulate in the
    stages' parameters' `.grad`; the caller applies the optimizer.
    """
    device = device or torch.device("cpu")
    S, m = schedule.num_stages, schedule.m
    nccl = dist.is_initialized() and dist.get_backend() == "nccl"
    if nccl:
        validate(schedule, "nccl")  # in-order matching and rendezvous sends: refuse what could hang
    param_storages = {p.untyped_storage().data_ptr() for mod in stages.values() for p in mod.parameters()}
    inputs: dict[tuple[int, int], Tensor] = {}
    outputs: dict[tuple[int, int], Tensor] = {}
    grad_outputs: dict[tuple[int, int], Tensor] = {}
    grad_inputs: dict[tuple[int, int], Tensor] = {}
    saved_bytes: dict[tuple[int, int], int] = {}
    losses: dict[int, float] = {}
    events: list[Event] = []
    pending_sends = []
    peak = peak_bytes = 0

    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def forward(a: Action) -> None:
        key = (a.microbatch, a.stage)
        if a.stage == 0:
            x = microbatches[a.microbatch].to(device)
        else:
            if key not in inputs:  # the previous stage ran on this rank (v chunks, or p = 1)
                inputs[key] = outputs[(a.microbatch, a.stage - 1)].detach()
            x = inputs[key].requires_grad_()
        seen: set[int] = set()

        def pack(t: Tensor) -> Tensor:  # count each stored activation once; weights are not stash
            ptr = t.untyped_storage().data_ptr()
            if ptr not in param_storages and ptr not in seen:
                seen.add(ptr)
                saved_bytes[key] = saved_bytes.get(key, 0) + t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = stages[a.stage](x)
            if a.stage == S - 1:
                out = loss_fn(out, targets[a.microbatch].to(device)) / m
                losses[a.microbatch] = out.item() * m
        outputs[key] = out

    def backward(a: Action) -> None:
        key = (a.microbatch, a.stage)
        if a.stage == S - 1:
            outputs[key].backward()
        else:
            if key not in grad_outputs:  # the next stage ran on this rank
                grad_outputs[key] = grad_inputs.pop((a.microbatch, a.stage + 1))
            torch.autograd.backward(outputs[key], grad_tensors=grad_outputs.pop(key))
        if a.stage > 0:
            grad_inputs[key] = inputs[key].grad
        inputs.pop(key, None)
        outputs.pop(key)
        saved_bytes.pop(key, None)

    def communicate(run: list[Action]) -> None:
        start = now()
        works, recvs = [], []
        ops = []
        for a in run:
            key = (a.microbatch, a.stage)
            if a.op == "send_fwd":
                t = outputs[key].detach()
            elif a.op == "send_bwd":
                t = grad_inputs.pop(key)
            else:
                t = torch.empty(input_shapes[a.stage + (a.op == "recv_bwd")], device=device, dtype=dtype)
                (inputs if a.op == "recv_fwd" else grad_outputs)[key] = t
                recvs.append(a)
            if nccl:
                ops.append(dist.P2POp(dist.isend if a.op.startswith("send") else dist.irecv, t, a.peer))
            elif a.op.startswith("send"):
                pending_sends.append((dist.isend(t, a.peer, tag=_tag(a, schedule, True)), t))
            else:
                works.append(dist.irecv(t, a.peer, tag=_tag(a, schedule, False)))
        if nccl:
            works = dist.batch_isend_irecv(ops)
        posted = now()  # a send's event lasts until it is posted; on gloo it does not wait for the peer
        for w in works:
            w.wait()
        end = now()
        events.extend(Event(rank, a, start, end if a in recvs else posted) for a in run)

    dist.barrier() if dist.is_initialized() else None
    t0 = now()
    actions = schedule.actions[rank]
    i = 0
    while i < len(actions):
        a = actions[i]
        if a.op in ("F", "B"):
            start = now()
            forward(a) if a.op == "F" else backward(a)
            events.append(Event(rank, a, start, now()))
            peak = max(peak, len(outputs))
            peak_bytes = max(peak_bytes, sum(saved_bytes.values()))
            i += 1
            continue
        j = i
        while j < len(actions) and actions[j].op not in ("F", "B"):
            j += 1
        communicate(list(actions[i:j]))
        i = j
    for w, _ in pending_sends:
        w.wait()
    events = [Event(e.rank, e.action, e.start - t0, e.end - t0) for e in events]
    return RankRun(losses, events, peak, peak_bytes)
