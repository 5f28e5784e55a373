"""The bytes a 3D step sends, read from the step's communication log, per mesh axis and kind.

`Trainer3D.train_step` opens one `distlab.comm_log` (with the mesh) around the step; every call the three
chapters make is in it, named by the mesh axis of its group, and none of them carries a recorder:
- tp: chapter 5's collectives (its layers' `f`, `g`, the sequence-parallel halves, the loss);
- dp: chapter 7's ZeRO reduce-scatters, all-gathers and all-reduces (its one control all-reduce per step,
  a flag per parameter saying which got a gradient, runs under the label `CONTROL` and is left out: it is
  not part of the volume the ZeRO paper and the cost model count);
- pp: chapter 4's sends. The executor posts a rank's sends in the order of its send actions in the
  schedule, so the k-th send on the pp axis is the k-th send action (its kind, send_fwd or send_bwd, is
  the action's op); the tied embedding's gradient swap runs under the label "tied_grad".
`step_traffic` turns the log into the same `Transfer`s as `cost_model.predicted_traffic`, with the ring's
bytes per rank for each collective (chapter 1) and a message's whole size for each send.
"""

from __future__ import annotations

from distlab.comm_log import CommLog
from distlab.memory.zero.engine import CONTROL
from distlab.parallel3d.cost_model import RING_STEPS, Traffic, add_collective, add_message
from distlab.pipeline import Schedule

TIED_GRAD = "tied_grad"  # the label of the tied embedding's gradient swap between the first and last stage


def step_traffic(log: CommLog, schedule: Schedule, pp_rank: int) -> Traffic:
    """The calls `log` recorded in one step of the rank at position `pp_rank` of the pipeline, as
    `Transfer`s per (axis, kind)."""
    out: Traffic = {}
    for axis in ("tp", "dp"):
        for r in log.select(axis=axis, op=tuple(RING_STEPS)):
            if CONTROL in r.where.split("/"):
                continue
            add_collective(out, axis, r.op, r.nbytes, r.group_size)
    sends = [a for a in schedule.actions[pp_rank] if a.op.startswith("send")]
    messages = [r for r in log.select(axis="pp", op="send") if TIED_GRAD not in r.where.split("/")]
    if len(messages) != len(sends):
        raise RuntimeError(f"the log holds {len(messages)} pipeline sends but the schedule has {len(sends)} "
                           f"send actions for pipeline rank {pp_rank}; was the log open for the whole step?")
    for action, r in zip(sends, messages, strict=True):
        add_message(out, "pp", action.op, r.nbytes)
    for r in log.select(axis="pp", op="send", where=TIED_GRAD):
        add_message(out, "pp", TIED_GRAD, r.nbytes)
    return out
