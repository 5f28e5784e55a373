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

What each record holds (op, axis, group size, bytes B, `where`, phase, ...) and what it costs on the
wire (`ring_bytes`) is `distlab.comm_record`, which needs no processes; this module re-exports it.

Logs nest: an inner log and an outer one both record a call. A log lives in one process; in ranks
started by `distlab.launch.run`, open it inside the function each rank runs. Like every dispatch mode
(and `CommDebugMode`) it is thread-local: it sees the calls of its thread and of autograd's backward
pass, but not a collective issued from another thread, such as the all-reduces of P and Q in PyTorch's
PowerSGD hook, which run in `Future.then` callbacks on the backend's (gloo's) thread (unless the future
has already completed when the callback is attached: then it runs at once, on the caller's thread).

`comm_log(all_threads=True)` also records those. While it is open it registers, with `torch.library`,
a kernel for every c10d op at the dispatch key `ADInplaceOrView` (a fall-through for these ops, so
autograd is untouched), which runs on whatever thread calls the op; it records the calls made on threads
where the log's dispatch mode is not active (on its own thread the mode records them) and passes every
call on. Such a call carries the labels open on the log at that moment (the opening thread's: a callback
belongs to the step that started it); set `phase` with `log.where(..., phase="backward")` around a
backward whose hooks hand collectives to other threads. On exit the kernels are removed. One such log is
open in a process at a time (a nested one, on the same thread, shares the outer one's kernels); calls on
other threads to DTensor's functional collectives, or on inference tensors, are not seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from distlab.comm_record import RING_FACTOR, CommRecord, ring_bytes
from distlab.mesh import mesh_axes

__all__ = ["RING_FACTOR", "CommLog", "CommRecord", "comm_log", "ring_bytes", "where"]


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


def _own_chunk(x: Tensor, input_splits: list[int] | None, rank: int, p: int) -> int:
    """Bytes of the rows of `x` that an all_to_all_single keeps on this rank (its split, or 1/p)."""
    rows = input_splits[rank] if input_splits else x.shape[0] // p
    return rows * (x.numel() // max(x.shape[0], 1)) * x.element_size()


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
    all_threads: also record the c10d calls of this process's other threads (see the module docstring).
    """

    def __init__(self, mesh: DeviceMesh | None = None,
                 groups: Mapping[str, dist.ProcessGroup] | None = None, all_threads: bool = False) -> None:
        super().__init__()
        self.mesh, self.groups, self.all_threads = mesh, dict(groups or {}), all_threads
        self.records: list[CommRecord] = []
        self._labels: list[tuple[str, str | None]] = []
        self._axes: dict[str, str] = {}
        self._library: torch.library.Library | None = None  # all_threads: the kernels this log registered
        self._sharers: list[CommLog] = []  # all_threads logs nested in this one, fed by its kernels
        self._host: CommLog | None = None  # the outer all_threads log whose kernels feed this one

    # -- other threads (all_threads=True) -------------------------------------------------------------

    def __enter__(self) -> CommLog:
        outer = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, CommLog) and m.all_threads]
        if self.all_threads and outer:
            self._host = outer[-1]._host or outer[-1]
            self._host._sharers.append(self)
        elif self.all_threads:
            self._register_kernels()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._library is not None:
            self._library._destroy()
            self._library = None
        if self._host is not None:
            self._host._sharers.remove(self)
            self._host = None
        super().__exit__(*exc)

    def _register_kernels(self) -> None:
        if torch._C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_", "ADInplaceOrView"):
            raise RuntimeError("another comm_log(all_threads=True) is open in this process, on another "
                               "thread; open one per process, or nest them on one thread")
        self._library = torch.library.Library("c10d", "IMPL")
        for name in _C10D:
            self._library.impl(name, self._kernel(name), "ADInplaceOrView")

    def _kernel(self, name: str) -> Callable[..., Any]:
        op = getattr(torch.ops.c10d, name).default

        def kernel(*args: Any, **kwargs: Any) -> Any:
            active = _get_current_dispatch_mode_stack()
            for log in (self, *self._sharers):
                if log not in active:  # on a thread where the log is a dispatch mode, the mode records it
                    log._record_c10d(name, args)
            with torch._C._AutoDispatchBelowADInplaceOrView():
                return op(*args, **kwargs)
        return kernel

    # -- naming ---------------------------------------------------------------------------------------

    def _named_groups(self) -> dict[str, str]:
        """group name -> axis, from the mesh (its axes, then its flattened axes) and `groups`."""
        named: dict[str, str] = {}
        if self.mesh is not None:
            for name in mesh_axes(self.mesh):
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
        labels = list(self._labels)  # a copy: another thread (all_threads) may be changing them
        phase = "backward" if torch._C._current_autograd_node() is not None else None
        for _, p in reversed(labels):
            phase = phase or p
        return "/".join(label for label, _ in labels if label), phase or "forward"

    # -- recording ------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func.namespace == "c10d" and func._opname in _C10D:
            self._record_c10d(func._opname, args)
        elif func.namespace == "_c10d_functional" and func._opname in _FUNCTIONAL:
            self._record_functional(func._opname, args)
        return func(*args, **kwargs)

    def _add(self, op: str, group_name: str, p: int, size: tuple[int, int, str], peer: int | None = None,
             own: int | None = None) -> None:
        where_, phase = self._where_and_phase()
        nbytes, numel, dtype = size
        self.records.append(CommRecord(op, self._axis(group_name), p, nbytes, numel, where_, phase, dtype,
                                       peer, own))

    def _record_c10d(self, name: str, args: tuple) -> None:
        op, index, times_p = _C10D[name]
        group = _group_of(args)
        p = group.size()
        size = (0, 0, "") if index is None else _size(args[index])
        if times_p:
            size = (size[0] * p, size[1] * p, size[2])
        peer = args[2] if name in _P2P else None
        own = None
        if name == "alltoall_":
            own = _size(args[1][group.rank()])[0]
        elif name == "alltoall_base_":
            own = _own_chunk(args[1], args[4], group.rank(), p)
        self._add(op, group.group_name, p, size, peer, own)

    def _record_functional(self, name: str, args: tuple) -> None:
        op, times_p = _FUNCTIONAL[name]
        group_name = args[-1]
        p = dist.distributed_c10d._resolve_process_group(group_name).size()
        size = _size(args[0])
        if times_p:
            size = (size[0] * p, size[1] * p, size[2])
        own = None
        if name == "all_to_all_single":
            rank = dist.get_rank(dist.distributed_c10d._resolve_process_group(group_name))
            own = _own_chunk(args[0], args[2], rank, p)
        self._add(op, group_name, p, size, None, own)

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


def comm_log(mesh: DeviceMesh | None = None, groups: Mapping[str, dist.ProcessGroup] | None = None,
             all_threads: bool = False) -> CommLog:
    """A log to open with `with comm_log(mesh=mesh) as log:`; it records every collective in the block,
    on this thread (and autograd's backward), or with `all_threads=True` on every thread of the process."""
    return CommLog(mesh, groups, all_threads)


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
