"""Distributed Muon, layout (a): gather to the owner.

Every tensor has an owner rank (`owners.greedy_owners`: Muon's matrices balanced by Newton-Schulz FLOPs,
AdamW's tensors by elements). Per step and per tensor of B bytes:

1. `reduce` to the owner: the owner gets the sum of the ranks' gradients and divides it by N, the
   data-parallel average (averaging and gathering in one collective; the others keep their own gradient);
2. the owner alone runs the optimizer on the whole tensor: Muon's momentum, Newton-Schulz and step
   (`newton_schulz.muon_matrix_step_`), or `torch.optim.AdamW`. Only the owner holds that tensor's
   optimizer state (momentum, or AdamW's two moments): state sharded by whole tensors;
3. `broadcast` from the owner: every replica gets the updated parameter.

So the log records one reduce and one broadcast of B for every tensor, 2 x (all parameters' bytes) in
B, on every rank. It needs no flat buffer and is the simplest to check, but an owner's work and memory
come in whole tensors, which cannot split evenly (an embedding's two AdamW moments land on one rank).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.comm_log import where
from distlab.memory.muon.common import check_parameters, gradient, same_start
from distlab.memory.muon.newton_schulz import MuonSettings, muon_matrix_step_, newton_schulz_flops
from distlab.memory.muon.owners import greedy_owners
from distlab.memory.muon.split import Named


class OwnerMuon:
    """Muon for `muon`'s matrices and AdamW for `adamw`'s tensors, each tensor updated on its owner rank of
    `group` (layout (a), see the module docstring). `settings`: the hyper-parameters of both
    (`MuonSettings`, torch.optim.Muon's names). Call `step()` after every rank's backward, as on a torch
    optimizer; it reads and leaves `p.grad`."""

    def __init__(self, muon: Named, adamw: Named, settings: MuonSettings | None = None,
                 group: dist.ProcessGroup | None = None) -> None:
        check_parameters(muon, adamw)
        self.muon, self.adamw, self.group = list(muon), list(adamw), group
        self.settings = settings or MuonSettings()
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.muon_owner = greedy_owners([newton_schulz_flops(p.shape, self.settings.ns_steps)
                                         for _, p in self.muon], self.n)
        self.adamw_owner = greedy_owners([p.numel() for _, p in self.adamw], self.n)
        same_start([p for _, p in [*self.muon, *self.adamw]], group)
        self.momentum = {name: torch.zeros_like(p) for (name, p), o in zip(self.muon, self.muon_owner,
                                                                            strict=True) if o == self.rank}
        mine = [p for (_, p), o in zip(self.adamw, self.adamw_owner, strict=True) if o == self.rank]
        self.inner = torch.optim.AdamW(mine, **self.settings.adamw_kwargs()) if mine else None

    def _averaged_on_owner(self, name: str, p: Tensor, owner: int) -> Tensor:
        """The data-parallel average of p's gradient, on its owner (a copy: p.grad is left alone)."""
        g = gradient(name, p).detach().clone()
        dist.reduce(g, group_dst=owner, group=self.group)
        return g.div_(self.n)

    @torch.no_grad()
    def step(self) -> None:
        """Reduce each gradient to its owner, update each tensor there, broadcast it from there."""
        with where("muon.owner"):
            for (name, p), owner in zip(self.muon, self.muon_owner, strict=True):
                g = self._averaged_on_owner(name, p, owner)
                if owner == self.rank:
                    muon_matrix_step_(p, g, self.momentum[name], self.settings)
            grads = {}
            for (name, p), owner in zip(self.adamw, self.adamw_owner, strict=True):
                g = self._averaged_on_owner(name, p, owner)
                if owner == self.rank:
                    grads[id(p)] = g
            if self.inner is not None:
                self._adamw_step(grads)
            works = [dist.broadcast(p.detach(), group=self.group, group_src=owner, async_op=True)
                     for (_, p), owner in zip([*self.muon, *self.adamw],
                                              [*self.muon_owner, *self.adamw_owner], strict=True)]
            for w in works:
                w.wait()

    def _adamw_step(self, grads: dict[int, Tensor]) -> None:
        """torch.optim.AdamW on this rank's tensors with the averaged gradients (p.grad put back after)."""
        params = self.inner.param_groups[0]["params"]  # type: ignore[union-attr]
        own = [p.grad for p in params]
        for p in params:
            p.grad = grads[id(p)]
        self.inner.step()  # type: ignore[union-attr]
        for p, g in zip(params, own, strict=True):
            p.grad = g

    def zero_grad(self) -> None:
        """Forget every parameter's gradient."""
        for _, p in [*self.muon, *self.adamw]:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes of optimizer state on this rank: its matrices' momentum, its AdamW tensors' two moments."""
        total = sum(b.numel() * b.element_size() for b in self.momentum.values())
        if self.inner is not None:
            for state in self.inner.state.values():
                total += sum(state[k].numel() * state[k].element_size() for k in ("exp_avg", "exp_avg_sq"))
        return total
