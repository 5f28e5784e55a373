"""NCCL's rules checked on what ranks actually called, on gloo and the CPU.

`RuleLog` is the house's `distlab.comm_log.CommLog` (a `TorchDispatchMode` that sees every c10d call) that
also notes, for each call, the devices of its tensors, the global ranks of its group, the peer's global
rank and whether a receive named its sender. Each rank opens one around its code and returns
`log.calls`; the launcher hands every rank's list to `check_calls`, which says what would break on a GPU
node although gloo accepted it:

- **device**: every tensor of a collective lives on the rank's device ("cuda" under NCCL; gloo takes
  CPU tensors, and NCCL fails with "No backend type associated with device type cpu");
- **any-source**: no `recv(src=None)` (gloo's `recv_any_source`; NCCL has none);
- **order / mismatch**: the k-th message from rank a to rank b is the k-th receive at b from a (NCCL
  ignores tags), with the same dtype and size; every rank of a group calls the same collectives (op,
  dtype, and the size where it is the same on every rank) in the same order — the fingerprint that
  `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks on gloo (its ProcessGroupWrapper) collective by collective.

The pairing itself is `rendezvous.check(program, run=False)`; whether an order can deadlock needs to
know which calls a rank waits for, which a log does not record, so that is checked on the schedules
themselves (`rendezvous.pipeline_program`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distlab.comm_log import _C10D, _FUNCTIONAL, CommLog
from distlab.gpu_check.rendezvous import Finding, Op, check
from distlab.staged_p2p import STAGED

SAME_SIZE = ("all_reduce", "broadcast", "reduce", "barrier")  # ops whose B is the same on every rank


@dataclass(frozen=True)
class Call:
    """One c10d call of one rank: `op` in chapter 1's words, the global `ranks` of its group, its
    dtype and element count (B, as `CommRecord`), the device types of its tensors, the peer's global
    rank (send and recv), and whether it was a receive from any source."""

    op: str
    ranks: tuple[int, ...]
    dtype: str
    numel: int
    devices: tuple[str, ...]
    peer: int | None = None
    any_source: bool = False
    where: str = ""


def _tensors(x: object) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _device_of(t: torch.Tensor) -> torch.device:
    """Where `t` stands: its device, or for a host copy that `distlab.staged_p2p` made to send or receive
    a CUDA tensor over gloo, that tensor's device."""
    return getattr(t, STAGED, t.device)


def _group(func: object, args: tuple) -> dist.ProcessGroup:
    if func.namespace == "_c10d_functional":  # type: ignore[attr-defined]
        return dist.distributed_c10d._resolve_process_group(args[-1])
    for a in args:
        if isinstance(a, torch.ScriptObject):
            return dist.ProcessGroup.unbox(a)
    raise RuntimeError("a c10d call without a process group argument")


class RuleLog(CommLog):
    """A `CommLog` whose `calls` list adds what NCCL's rules need (see `Call`).

    device: the rank's device (`launch.device()`, or one a test declares, e.g. "cuda:0" on a gloo rank):
    then every tensor handed to a collective must be on it (a device without an index, "cuda", takes any
    GPU), and one on another device is an error naming the call, raised before the call runs when
    `strict`, else kept in `device_errors` (`strict.py` has the CPU stand-in for a GPU node)."""

    def __init__(self, *args: object, device: str | torch.device | None = None, strict: bool = False,
                 **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[Call] = []
        self.device = None if device is None else torch.device(device)
        self.strict = strict
        self.device_errors: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if self.device is not None and is_collective(func):
            self._check_device(func, args)
            _check_gloo_p2p(func, args)
        before = len(self.records)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.records) > before:
            r, group = self.records[-1], _group(func, args)
            peer = r.peer if func._opname in ("send", "recv_") else None
            devices = tuple(sorted({_device_of(t).type for t in _tensors(args)}))
            ranks = tuple(dist.get_process_group_ranks(group))
            self.calls.append(Call(r.op, ranks, r.dtype, r.numel, devices,
                                   None if peer is None else dist.get_global_rank(group, peer),
                                   func._opname == "recv_any_source_", r.where))
        return out


    def _check_device(self, func: object, args: tuple) -> None:
        wrong = sorted({str(t.device) for t in _tensors(args)
                        if not on_device_type(_device_of(t), self.device)})
        if not wrong:
            return
        where_ = self._where_and_phase()[0]
        ns, op = func.namespace, func._opname  # type: ignore[attr-defined]
        name = f"{(_C10D.get(op) if ns == 'c10d' else _FUNCTIONAL.get(op))[0]} ({ns}.{op})"
        message = device_message(name + (f" in {where_}" if where_ else ""), wrong, self.device)
        if self.strict:
            raise DeviceError(message)
        self.device_errors.append(message)


def _check_gloo_p2p(func: object, args: tuple) -> None:
    """gloo stages the CUDA tensors of its collectives through host memory, but its send and recv hand
    the tensor's data pointer to the network as host memory (ProcessGroupGloo::send): stop such a call
    with an error that says so, before it fails in the transport."""
    if getattr(func, "_opname", "") not in ("send", "recv_", "recv_any_source_"):
        return
    if any(t.is_cuda for t in _tensors(args)) and _group(func, args).name() == "gloo":
        raise DeviceError(f"{func._opname.rstrip('_')} of a CUDA tensor over gloo: gloo sends and receives "  # type: ignore[attr-defined]
                          "host memory only (its collectives stage CUDA tensors, its point-to-point calls "
                          "do not); send and receive through distlab.staged_p2p (isend, irecv, send, "
                          "recv), which stages them through host memory, or run these ranks on NCCL")


class DeviceError(RuntimeError):
    """A tensor handed to a collective is not on the rank's device (what NCCL refuses)."""


def is_collective(func: object) -> bool:
    """Whether a dispatched op is one of the c10d collectives or messages the log records."""
    ns, name = getattr(func, "namespace", ""), getattr(func, "_opname", "")
    return (ns == "c10d" and name in _C10D) or (ns == "_c10d_functional" and name in _FUNCTIONAL)


def on_device(t: torch.Tensor, device: torch.device) -> bool:
    """`t` is on `device` (a device without an index, such as "cuda", matches every index)."""
    return on_device_type(t.device, device)


def on_device_type(d: torch.device, device: torch.device) -> bool:
    """`d` is `device` (a device without an index matches every index of its type)."""
    return d.type == device.type and (device.index is None or d.index == device.index)


def device_message(call: str, wrong: Sequence[str], device: torch.device) -> str:
    """The error of a collective given a tensor on the wrong device, naming the call and the fix."""
    stand_in = (" (the strict check's stand-in for the default device: it was made without device=)"
                if "meta" in wrong else "")
    return (f"{call}: a tensor on {', '.join(wrong)}{stand_in}, but this rank's device is {device}: "
            "make it with device=launch.device(), or move it there with .to(launch.device()), before "
            "handing it to the collective (NCCL takes only tensors on the rank's own GPU)")


def rule_log(device: str | torch.device | None = None, strict: bool = False) -> RuleLog:
    """A log to open around a rank's code: `with rule_log() as log: ...; return log.calls`; with
    `device`, every collective's tensors must be on it (see `RuleLog`)."""
    return RuleLog(device=device, strict=strict)


def _key(c: Call) -> tuple:
    return (c.op, c.dtype, c.numel if c.op in SAME_SIZE else None)


def check_calls(calls: Sequence[Sequence[Call]], device: str | Sequence[str] = "cuda") -> list[Finding]:
    """Every NCCL rule the ranks' recorded calls break (`calls[r]`: rank r's, in order); `device` is the
    device type each rank's tensors must be on (one for all, or one per rank). [] if none."""
    want = [device] * len(calls) if isinstance(device, str) else list(device)
    if len(want) != len(calls):
        raise ValueError(f"device has {len(want)} entries for {len(calls)} ranks; give one per rank or one "
                         "for all, e.g. device='cuda'")
    findings = []
    program: list[list[Op]] = []
    for r, mine in enumerate(calls):
        steps = []
        for i, c in enumerate(mine):
            wrong = [d for d in c.devices if d != want[r]]
            if wrong:
                what = c.op + (f" in {c.where}" if c.where else "")
                findings.append(Finding("device", f"rank {r}, call {i} ({what}): "
                                        f"a tensor on {', '.join(wrong)}, but this rank's device is "
                                        f"{want[r]}; create it with device=launch.device()"))
            if c.op in ("send", "recv"):
                steps.append(Op(c.op, None if c.any_source else c.peer, (c.dtype, c.numel)))
            else:
                steps.append(Op("collective", key=_key(c), name=str(_key(c)), group=c.ranks))
        program.append(steps)
    return findings + check(program, run=False)
