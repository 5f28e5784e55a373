"""A GPU node's device rule, played on gloo and the CPU: `with strict_devices(): ...` inside a rank.

On a GPU node a rank's tensors belong on its GPU (`launch.device()`), while a tensor made without
`device=` lands on the default device, the CPU; NCCL then refuses it ("No backend type associated with
device type cpu"). On a CPU machine both are the CPU, so the mistake cannot show. `strict_devices` makes
it show: it makes the default device `meta` (tensors without data) and opens a strict `RuleLog` whose
device is the rank's own (`torch.as_tensor` of a tensor excepted: it stays where it is, as on a GPU
node). A tensor made without `device=` is then a meta tensor, and handing it to a
collective raises a `DeviceError` naming the call, before gloo sees it, just as NCCL would fail on
the node; mixing it with the rank's tensors fails in torch itself, as mixing CPU and GPU tensors does.
Code that names its device everywhere (`device=launch.device()` for the rank's tensors, `device="cpu"`
for a reference it builds to compare with) runs unchanged.

One pattern that is right on a GPU node fails here: building a model on the default device and then
moving it (`MLP(sizes).to(device)`), because a meta tensor has no data to move. Such code runs under
the rule once it builds inside `with torch.device("cpu"):` (as the chapter checks do); the chapters'
trainers (data, tensor, pipeline and context parallelism, MoE, 3D) still build and move, so on CPU the
rule covers the exercise checks, and a GPU node's NCCL run (tests/gpu_check/test_gpu.py) covers the trainers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from distlab.gpu_check.rules import RuleLog

STAND_IN = "meta"  # where tensors made without device= go under strict_devices


class _NewTensorsOnMeta(TorchFunctionMode):
    """Tensor constructors without `device=` make meta tensors (as `with torch.device("meta")` does),
    except `torch.as_tensor` of a tensor, which keeps it where it is on a GPU node too."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        keeps = func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)
        if func in _device_constructors() and kwargs.get("device") is None and not keeps:
            kwargs["device"] = STAND_IN
        return func(*args, **kwargs)


@contextmanager
def strict_devices(device: str | torch.device | None = None) -> Iterator[RuleLog]:
    """Inside a rank: the default device becomes `meta`, and every collective's tensors must be on
    `device` (default `launch.device()`), else a `DeviceError` naming the call. Yields the log."""
    from distlab import launch

    want = torch.device(device) if device is not None else launch.device()
    with RuleLog(device=want, strict=True) as log, _NewTensorsOnMeta():
        yield log
