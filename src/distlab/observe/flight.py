"""Torch's flight recorder: the last collectives each rank issued, with their sequence numbers.

Every c10d process group can keep a ring buffer of its most recent collectives (PyTorch's "Flight
Recorder for debugging stuck jobs" tutorial): for each, the group, a per-group sequence number
(`collective_seq_id`), the operation's profiling name (`gloo:all_reduce`, `nccl:broadcast`), the input
and output sizes, and a state. It is off unless `TORCH_FR_BUFFER_SIZE` (older name:
`TORCH_NCCL_TRACE_BUFFER_SIZE`) is a positive number of entries when the group is created; in torch 2.13
it covers gloo as well as NCCL (checked in this course's tests), and a rank reads its own buffer with
`torch._C._distributed_c10d._dump_fr_trace_json` (`_dump_nccl_trace_json` in older CUDA builds). On NCCL
the state moves from scheduled to started to completed (with `TORCH_NCCL_ENABLE_TIMING=1`); on gloo every
entry stays "scheduled", so only the order and the sizes are evidence there, which is what `hang`
compares. `torch.distributed.flight_recorder`'s `fr_trace` command analyses dumps written to files;
this module reads the buffer in the rank, into `CollectiveRecord`s.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

BUFFER_VAR = "TORCH_FR_BUFFER_SIZE"


@dataclass(frozen=True)
class CollectiveRecord:
    """One entry of a rank's flight recorder: sequence number in its group, operation, input sizes."""

    seq: int
    op: str
    sizes: tuple[tuple[int, ...], ...]
    group: str = ""
    state: str = ""

    @property
    def signature(self) -> tuple[str, tuple[tuple[int, ...], ...]]:
        """What every rank must agree on at this sequence number: the operation and the sizes."""
        return self.op, self.sizes

    def describe(self) -> str:
        """`all_reduce [6]`: the operation without its backend prefix, and its input sizes."""
        shapes = ", ".join(str(list(s)) for s in self.sizes)
        return f"{self.op.split(':')[-1]} {shapes}".strip()


def enabled() -> bool:
    """Whether groups created from now on in this process keep a flight record."""
    value = os.environ.get(BUFFER_VAR, os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0"))
    return value.strip().isdigit() and int(value) > 0


def records_from_dump(dump: dict[str, Any], group_name: str | None = None) -> list[CollectiveRecord]:
    """The collectives (no point-to-point entries) of a flight-recorder dump, optionally of one group
    (its `group_name`), in sequence order."""
    if "entries" not in dump:
        raise ValueError("the dump has no 'entries': pass the parsed JSON of a flight-recorder dump "
                         f"(keys seen: {sorted(dump)})")
    out = []
    for e in dump["entries"]:
        name = str(e.get("process_group", ["", ""])[0])
        if e.get("is_p2p") or (group_name is not None and name != group_name):
            continue
        sizes = tuple(tuple(int(d) for d in s) for s in e.get("input_sizes", []))
        out.append(CollectiveRecord(int(e["collective_seq_id"]), str(e["profiling_name"]), sizes, name,
                                    str(e.get("state", ""))))
    return sorted(out, key=lambda r: r.seq)


def dump(group: dist.ProcessGroup | None = None) -> list[CollectiveRecord]:
    """This rank's flight record of `group` (None: every group), read from torch's buffer."""
    if not enabled():
        raise RuntimeError(f"the flight recorder is off: set {BUFFER_VAR}=2000 (entries kept per process) in "
                           "the environment before the process groups are created, e.g. before launch.run")
    import torch._C._distributed_c10d as c10d

    reader = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json", None)
    if reader is None:
        raise RuntimeError("this torch build has no flight-recorder reader (_dump_fr_trace_json); use torch "
                           ">= 2.6")
    parsed = json.loads(reader(True, False))  # collectives included; completed ones too, not only active
    if "entries" not in parsed:
        parsed = {**parsed, "entries": []}
    return records_from_dump(parsed, None if group is None else group.group_name)
