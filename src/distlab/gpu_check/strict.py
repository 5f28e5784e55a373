"""A GPU node's device rule, played on gloo and the CPU: `with strict_devices(): ...` inside a rank.

On a GPU node a rank's tensors belong on its GPU (`launch.device()`), while a tensor made without
`device=` lands on the default device, the CPU; NCCL then refuses it ("No backend type associated with
device type cpu"). On a CPU machine both are the CPU, so the mistake cannot show. `strict_devices` makes
it show: it makes the default device `meta` (tensors without data) and opens a strict `RuleLog` whose
device is the rank's own. A tensor made without `device=` is then a meta tensor, and handing it to a
collective raises a `DeviceError` naming the call, before gloo sees it, just as NCCL would fail on
the node; mixing it with the rank's tensors fails in torch itself, as mixing CPU and GPU tensors does.
Code that names its device everywhere (`device=launch.device()` for the rank's tensors, `device="cpu"`
for a reference it builds to compare with) runs unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from distlab.gpu_check.rules import RuleLog

STAND_IN = "meta"  # where tensors made without device= go under strict_devices


@contextmanager
def strict_devices(device: str | torch.device | None = None) -> Iterator[RuleLog]:
    """Inside a rank: the default device becomes `meta`, and every collective's tensors must be on
    `device` (default `launch.device()`), else a `DeviceError` naming the call. Yields the log."""
    from distlab import launch

    want = torch.device(device) if device is not None else launch.device()
    with RuleLog(device=want, strict=True) as log, torch.device(STAND_IN):
        yield log
