"""One communication log for the whole course: every collective a process calls, seen from below.

A chapter never threads a recorder through its functions. It runs its step inside a log:

    with comm_log(mesh=mesh) as log:
        with log.where("forward"):
            loss = model(batch)
        loss.backward()
    log.bytes(axis="tp", op="all_reduce")          # the size of every tensor tp all-reduced
    log.sent_bytes(axis="dp")                      # what this rank put on the wire, ring algorithms

`CommLog` is a `TorchDispatchMode`, the mechanism of PyTorch's own `CommDebugMode`
(torch.distributed.tensor.debug): every `torch.distributed` call reaches the dispatcher as a `c10d` op
(`c10d.allreduce_`, `c10d._allgather_base_`, `c10d.send`, ...; DTensor's functional collectives as
`_c10d_functional` ops), and a dispatch mode sees each one, also with `async_op=True`, also inside
autograd's backward pass. The log records one `CommRecord` per call and passes the call on unchanged.

What each record holds:
- `op`: the collective in chapter 1's words: all_reduce, all_gather, reduce_scatter, all_to_all,
  broadcast, reduce, gather, scatter, send, recv, barrier.
- `axis`: the mesh axis the group belongs to ("dp", "tp", a flattened "dp_cp", ...) when the log was
  given the mesh (or `groups=`); otherwise the group's name; "world" for the default group.
- `group_size` (p), `dtype`, `numel` and `nbytes`. `nbytes` (B) is chapter 1's convention, the size of
  the *whole* buffer the collective is about, the same on every rank:
    all_reduce, broadcast, reduce      the tensor (the reduced tensor)
    all_gather, gather                 the gathered output: p x this rank's input
    reduce_scatter, scatter            the full input: p x this rank's output
    all_to_all                         this rank's input buffer (all p chunks, its own included)
    send, recv                         the message
    barrier                            0
  The bytes a rank actually sends follow from B and p by `ring_bytes`.
- `where`: the labels open at the call, joined by "/" (outermost first): `log.where(label)` labels
  one log's records; the module-level `where(label)` labels every open log, for library code that
  does not know the log (a tensor-parallel layer labels its collectives with its name).
- `phase`: "backward" when the call runs inside autograd's backward pass, else "forward" (a `where`
  may set it for work that belongs to a phase but runs outside autograd, e.g. a gradient reduction).
- `peer`: for send and recv, the other rank's position in the group.

Logs nest: an inner log and an outer one both record a call. A log lives in one process; in ranks
started by `distlab.launch.run`, open it inside the function each rank runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

__all__ = ["RING_FACTOR", "CommLog", "CommRecord", "comm_log", "ring_bytes", "where"]

# Bytes each rank sends under the ring (or chain) algorithm of chapter 1, as a multiple of B, for a group
# of p > 1 ranks (Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005). A ring reduce-scatter sends
# p - 1 chunks of B/p; an all-gather the same; an all-reduce is the two in turn. All-to-all sends every
# chunk but its own. Gather and scatter count the root's link, the busiest one. A pipelined broadcast or
# reduce passes the whole buffer along the chain once; a point-to-point message is sent once.
RING_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "gather": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0 if p > 1 else 0.0,
    "reduce": lambda p: 1.0 if p > 1 else 0.0,
    "send": lambda p: 1.0,
    "recv": lambda p: 1.0,
    "barrier": lambda p: 0.0,
}


def ring_bytes(op: str, nbytes: float, group_size: int) -> float:
    """The bytes one rank sends for a collective about B = `nbytes` bytes on p = `group_size` ranks,
    with the ring algorithms of chapter 1 (Patarasuk & Yuan 2009): 2 (p-1)/p B for an all-reduce,
    (p-1)/p B for an all-gather, a reduce-scatter or an all-to-all, B for a broadcast and for a
    point-to-point message (for "recv" it is what arrives). p = 1 sends nothing but a message."""
    if op not in RING_FACTOR:
        raise ValueError(f"op={op!r} is not a collective the log knows; choose one of "
                         f"{', '.join(RING_FACTOR)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size={group_size!r} must be a positive integer (the ranks in the group)")
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r} must be >= 0 (the size of the buffer in bytes)")
    return RING_FACTOR[op](group_size) * nbytes


@dataclass(frozen=True)
class CommRecord:
    """One collective call, as this rank made it (see the module docstring for what B = `nbytes` is
    per op). A predicted record (a cost model's) has the same fields, with `dtype` "" when unknown."""

    op: str
    axis: str
    group_size: int
    nbytes: int
    numel: int
    where: str = ""
    phase: str = "forward"
    dtype: str = ""
    peer: int | None = None

    @property
    def sent_bytes(self) -> float:
        """What this rank sends for this call under the ring algorithm (`ring_bytes`); 0 for a recv."""
        return 0.0 if self.op == "recv" else ring_bytes(self.op, self.nbytes, self.group_size)


def _size(tensors: object) -> tuple[int, int, str]:
    """(bytes, elements, dtype) of a tensor or of a (nested) list of tensors."""
    if isinstance(tensors, Tensor):
        return tensors.numel() * tensors.element_size(), tensors.numel(), str(tensors.dtype).removeprefix(
            "torch.")
    total, count, dtype = 0, 0, ""
    for t in tensors:  # type: ignore[attr-defined]
        b, n, d = _size(t)
        total, count, dtype = total + b, count + n, dtype or d
    return total, count, dtype


# c10d op -> (our op, index of the argument whose size is B, multiply it by p?)
_C10D = {
    "allreduce_": ("all_reduce", 0, False), "allreduce_coalesced_": ("all_reduce", 0, False),
    "allgather_": ("all_gather", 0, False), "_allgather_base_": ("all_gather", 0, False),
    "allgather_coalesced_": ("all_gather", 0, False),
    "allgather_into_tensor_coalesced_": ("all_gather", 0, False),
    "reduce_scatter_": ("reduce_scatter", 1, False), "_reduce_scatter_base_": ("reduce_scatter", 1, False),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, False),
    "alltoall_": ("all_to_all", 1, False), "alltoall_base_": ("all_to_all", 1, False),
    "broadcast_": ("broadcast", 0, False), "reduce_": ("reduce", 0, False),
    "gather_": ("gather", 1, True), "scatter_": ("scatter", 0, True),
    "send": ("send", 0, False), "recv_": ("recv", 0, False), "recv_any_source_": ("recv", 0, False),
    "barrier": ("barrier", None, False),
}
# _c10d_functional op (DTensor's) -> (our op, multiply the input by p?); the group is its last argument
_FUNCTIONAL = {
    "all_reduce": ("all_reduce", False), "all_reduce_": ("all_reduce", False),
    "all_reduce_coalesced": ("all_reduce", False), "all_reduce_coalesced_": ("all_reduce", False),
    "all_gather_into_tensor": ("all_gather", True), "all_gather_into_tensor_coalesced": ("all_gather", True),
    "reduce_scatter_tensor": ("reduce_scatter", False),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", False),
    "all_to_all_single": ("all_to_all", False), "broadcast": ("broadcast", False),
    "broadcast_": ("broadcast", False),
}
_P2P = ("send", "recv_")


def _group_of(args: tuple) -> dist.ProcessGroup:
    """The process group of a c10d call: its first opaque argument (a reduce op, when any, comes later)."""
    for a in args:
        if isinstance(a, torch.ScriptObject):
            return dist.ProcessGroup.unbox(a)
    raise RuntimeError("a c10d call without a process group argument; the log cannot name its group")


class CommLog(TorchDispatchMode):
    """Records every collective called in this process while it is open (use `comm_log(...)`).

    mesh: a DeviceMesh whose axis names (and flattened axes, e.g. "dp_cp") name the groups.
    groups: more names, {axis: ProcessGroup}, for groups that are not on the mesh.
    """

    def __init__(self, mesh: DeviceMesh | None = None,
                 groups: Mapping[str, dist.ProcessGroup] | None = None) -> None:
        super().__init__()
        self.mesh, self.groups = mesh, dict(groups or {})
        self.records: list[CommRecord] = []
        self._labels: list[tuple[str, str | None]] = []
        self._axes: dict[str, str] = {}

    # -- naming ---------------------------------------------------------------------------------------

    def _named_groups(self) -> dict[str, str]:
        """group name -> axis, from the mesh (its axes, then its flattened axes) and `groups`."""
        named: dict[str, str] = {}
        if self.mesh is not None:
            for name in self.mesh.mesh_dim_names or ():
                named.setdefault(self.mesh.get_group(name).group_name, name)
            # axes made by flattening (e.g. mesh["dp", "cp"]._flatten("dp_cp")): torch keeps them on the root
            flattened = getattr(self.mesh._get_root_mesh(), "_flatten_mapping", {})
            for name, sub in flattened.items():
                named.setdefault(sub.get_group().group_name, name)
        for name, group in self.groups.items():
            named.setdefault(group.group_name, name)
        return named

    def _axis(self, group_name: str) -> str:
        if group_name not in self._axes:
            self._axes = self._named_groups()
            if group_name not in self._axes:
                world = dist.group.WORLD
                self._axes[group_name] = ("world" if world is not None and group_name == world.group_name
                                          else group_name)
        return self._axes[group_name]

    # -- labels ---------------------------------------------------------------------------------------

    @contextmanager
    def where(self, label: str, phase: str | None = None) -> Iterator[CommLog]:
        """Label this log's records made inside the block (`phase` also sets their phase outside autograd)."""
        self._labels.append((label, phase))
        try:
            yield self
        finally:
            self._labels.pop()

    def _where_and_phase(self) -> tuple[str, str]:
        phase = "backward" if torch._C._current_autograd_node() is not None else None
        for _, p in reversed(self._labels):
            phase = phase or p
        return "/".join(label for label, _ in self._labels if label), phase or "forward"

    # -- recording ------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func.namespace == "c10d" and func._opname in _C10D:
            self._record_c10d(func._opname, args)
        elif func.namespace == "_c10d_functional" and func._opname in _FUNCTIONAL:
            self._record_functional(func._opname, args)
        return func(*args, **kwargs)

    def _add(self, op: str, group_name: str, p: int, size: tuple[int, int, str], peer: int | None) -> None:
        where_, phase = self._where_and_phase()
        nbytes, numel, dtype = size
        self.records.append(CommRecord(op, self._axis(group_name), p, nbytes, numel, where_, phase, dtype,
                                       peer))

    def _record_c10d(self, name: str, args: tuple) -> None:
        op, index, times_p = _C10D[name]
        group = _group_of(args)
        p = group.size()
        size = (0, 0, "") if index is None else _size(args[index])
        if times_p:
            size = (size[0] * p, size[1] * p, size[2])
        peer = args[2] if name in _P2P else None
        self._add(op, group.group_name, p, size, peer)

    def _record_functional(self, name: str, args: tuple) -> None:
        op, times_p = _FUNCTIONAL[name]
        group_name = args[-1]
        p = dist.distributed_c10d._resolve_process_group(group_name).size()
        size = _size(args[0])
        if times_p:
            size = (size[0] * p, size[1] * p, size[2])
        self._add(op, group_name, p, size, None)

    # -- queries --------------------------------------------------------------------------------------

    def select(self, *, op: str | tuple[str, ...] | None = None, axis: str | None = None,
               where: str | None = None, phase: str | None = None) -> list[CommRecord]:
        """The records that match every filter given. `where` matches whole labels anywhere in the
        path: where="attn" matches "h.0/attn" and "attn/c_proj", not "attn2"."""
        ops = (op,) if isinstance(op, str) else op
        return [r for r in self.records
                if (ops is None or r.op in ops) and (axis is None or r.axis == axis)
                and (phase is None or r.phase == phase)
                and (where is None or f"/{where}/" in f"/{r.where}/")]

    def bytes(self, **filters: object) -> int:
        """The sum of B (`nbytes`, the whole buffers) over the matching records; filters as `select`."""
        return sum(r.nbytes for r in self.select(**filters))  # type: ignore[arg-type]

    def calls(self, **filters: object) -> int:
        """How many calls match; filters as `select`."""
        return len(self.select(**filters))  # type: ignore[arg-type]

    def sent_bytes(self, **filters: object) -> float:
        """What this rank sent in the matching calls, under the ring algorithms (`ring_bytes`)."""
        return sum(r.sent_bytes for r in self.select(**filters))  # type: ignore[arg-type]

    def clear(self) -> None:
        self.records.clear()


def comm_log(mesh: DeviceMesh | None = None,
             groups: Mapping[str, dist.ProcessGroup] | None = None) -> CommLog:
    """A log to open with `with comm_log(mesh=mesh) as log:`; it records every collective in the block."""
    return CommLog(mesh, groups)


@contextmanager
def where(label: str, phase: str | None = None) -> Iterator[None]:
    """Label the records of every open log (in this thread) made inside the block, without knowing the
    logs: what library code uses (a layer labels its collectives with its name). Outside a log it does
    nothing."""
    logs = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, CommLog)]
    for log in logs:
        log._labels.append((label, phase))
    try:
        yield
    finally:
        for log in logs:
            log._labels.pop()
