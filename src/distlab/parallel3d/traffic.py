"""The bytes a 3D step sends, recorded from the calls it makes, per mesh dim and kind.

Three sources, one per dim, each the chapter's own record of its calls:
- tp: chapter 5's `CommRecorder`, given to every tensor-parallel layer and to the loss;
- pp: chapter 4's executor calls `on_send(action, tensor)` for every activation or gradient it sends,
  and the tied embedding's gradient swap is logged where `train` calls it;
- dp: chapter 7's `ZeRO` logs each collective in its `CommLog`.
`StepTraffic.traffic()` turns them into the same `Transfer`s as `cost_model.predicted_traffic`, with the
ring's bytes per rank for each collective (chapter 1) and a message's whole size for each send.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from distlab.memory.zero.comm import CommLog
from distlab.parallel3d.cost_model import Traffic, add_collective, add_message
from distlab.pipeline import Action
from distlab.tensor_parallel import CommRecorder


@dataclass
class StepTraffic:
    """The records of one step on one rank: tp collectives, pp messages, dp collectives (ZeRO's log)."""

    tp_size: int
    dp_size: int
    tp: CommRecorder = field(default_factory=CommRecorder)
    pp: list[tuple[str, int]] = field(default_factory=list)
    dp: CommLog | None = None

    def on_send(self, action: Action, tensor: Tensor) -> None:
        """Chapter 4's executor hook: one activation (send_fwd) or gradient (send_bwd) sent."""
        self.pp.append((action.op, tensor.numel() * tensor.element_size()))

    def clear(self) -> None:
        self.tp.clear()
        self.pp.clear()
        if self.dp is not None:
            self.dp.clear()

    def traffic(self) -> Traffic:
        """The recorded calls as `Transfer`s per (dim, kind)."""
        out: Traffic = {}
        for r in self.tp.records:
            add_collective(out, "tp", r.op, r.nbytes, self.tp_size)
        for kind, nbytes in self.pp:
            add_message(out, "pp", kind, nbytes)
        for r in self.dp.records if self.dp is not None else []:
            add_collective(out, "dp", r.op, r.buffer_bytes, r.group_size)
        return out
