"""ZeRO stage 3's parameter schedule: gather a unit just before it computes, free it after, prefetch the next.

With the parameters partitioned (Rajbhandari et al. 2020, sec. 5.3, "P_os+g+p"), a rank holds only its
1/N shard of each unit's flat buffer. The full parameters of a unit exist only while it computes:

- forward: before the unit's forward, all-gather its parameters; after, free them;
- backward: when the gradient of the unit's output arrives (a hook on the output tensor), all-gather them
  again; when the last of its parameters' gradients has been reduce-scattered, free them (the engine,
  `zero.ZeRO`, calls `release`).

So each step all-gathers every parameter twice, Psi + Psi, and reduce-scatters the gradients once, Psi:
3 Psi in all, 1.5x plain data parallelism's 2 Psi (sec. 7.2.2). While unit i computes, the all-gather of
the unit that comes next is already under way (an async work handle): the prefetch that hides the
communication behind computation, as DeepSpeed and FSDP do.

The root unit (the parameters of the model that belong to no other unit, such as embeddings) is first in
forward order and its forward spans the whole model's, so it stays gathered through the forward; it is
gathered again as soon as the backward starts.

Every rank must run the units in the same order, or the all-gathers pair up wrongly: before each unit's
forward, and where the backward begins, the ranks agree on which unit that is (`order.agree_on_unit`),
and raise the same clear error on every rank where they do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import where
from distlab.dist_compat import all_gather_single
from distlab.memory.zero.flat import alloc_storage, free_storage
from distlab.memory.zero.order import agree_on_unit


def _output_tensors(out: Any) -> list[Tensor]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [t for t in items if isinstance(t, Tensor) and t.requires_grad]


class ParameterGather:
    """Gather, free and prefetch the flat parameter buffers of stage-3 units.

    `flats[i]` is unit i's full buffer (its parameters are views of it) and `shards[i]` the rank's part;
    `modules[i]` is the module whose forward needs it, the root (if it has parameters: `has_root`)
    first. Forward order is 0, 1, ..., K-1; backward order is 0 (root), K-1, ..., 1. `names[i]` names
    unit i in the error raised when the ranks run different units.
    """

    def __init__(self, modules: Sequence[nn.Module], flats: Sequence[Tensor], shards: Sequence[Tensor],
                 group: dist.ProcessGroup | None, prefetch: bool = True, has_root: bool = True,
                 names: Sequence[str] | None = None) -> None:
        self.flats, self.shards, self.group = list(flats), list(shards), group
        self.prefetch = prefetch
        self.names = list(names) if names is not None else [f"unit {i}" for i in range(len(self.flats))]
        self.pending: dict[int, dist.Work] = {}
        self.gathered: set[int] = set()
        self.done_backward: set[int] = set()
        self.backward_agreed = True  # the ranks agreed on the first unit of this backward (`order`)
        k = len(self.flats)
        self.forward_order = list(range(k))
        first = 1 if has_root else 0  # the root is gathered first in both orders
        self.backward_order = [*range(first), *range(k - 1, first - 1, -1)]
        self.handles = []
        for i, module in enumerate(modules):
            self.handles.append(module.register_forward_pre_hook(self._pre_forward_hook(i)))
            self.handles.append(module.register_forward_hook(self._post_forward_hook(i)))
        for i in range(k):
            free_storage(self.flats[i])

    # -- gathering and freeing
    def _start(self, i: int, async_op: bool) -> None:
        if i in self.gathered or i in self.pending:
            return
        alloc_storage(self.flats[i])
        with where(f"unit{i}"):
            work = all_gather_single(self.flats[i], self.shards[i], group=self.group, async_op=async_op)
        if async_op:
            self.pending[i] = work
        else:
            self.gathered.add(i)

    def ensure(self, i: int) -> None:
        """Unit i's full parameters, now: wait for its prefetch, or gather it."""
        if i in self.pending:
            self.pending.pop(i).wait()
            self.gathered.add(i)
        self._start(i, async_op=False)

    def release(self, i: int) -> None:
        """Free unit i's full parameters (keep the shard)."""
        if i in self.pending:  # never leave a collective in flight on a buffer we free
            self.pending.pop(i).wait()
        free_storage(self.flats[i])
        self.gathered.discard(i)

    def _prefetch_after(self, order: list[int], i: int) -> None:
        pos = order.index(i)
        if self.prefetch and pos + 1 < len(order):
            self._start(order[pos + 1], async_op=True)

    def gather_all(self) -> None:
        """Gather every unit (to read the whole model, e.g. for a parity check); a collective."""
        for i in range(len(self.flats)):
            self.ensure(i)

    def release_all(self) -> None:
        for i in range(len(self.flats)):
            self.release(i)

    # -- the hooks
    def _agree(self, i: int, phase: str) -> None:
        agree_on_unit(i, phase, self.names, self.group, self.flats[i].device)

    def _pre_forward_hook(self, i: int):
        def hook(module: nn.Module, args: Any) -> None:
            self._agree(i, "forward")
            self.backward_agreed = False
            self.done_backward.discard(i)
            self.ensure(i)
            self._prefetch_after(self.forward_order, i)
        return hook

    def _post_forward_hook(self, i: int):
        def hook(module: nn.Module, args: Any, out: Any) -> None:
            if torch.is_grad_enabled():
                for t in _output_tensors(out):
                    t.register_hook(self._pre_backward_hook(i))
            self.release(i)
        return hook

    def _pre_backward_hook(self, i: int):
        def hook(grad: Tensor) -> None:
            if not self.backward_agreed:  # the first unit the backward reaches
                self.backward_agreed = True
                self._agree(i, "backward")
            if i not in self.done_backward:
                self.ensure(i)
                self._prefetch_after(self.backward_order, i)
        return hook

    def mark_backward_done(self, i: int) -> None:
        """The engine has reduce-scattered unit i's gradients: free it until the next forward."""
        self.done_backward.add(i)
        self.release(i)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
