"""Distributed Muon, layout (b): from ZeRO's flat shards to one matrix per owner and back, by all-to-all.

The parameters, gradients and optimizer state stay in ZeRO's flat layout (`flat_layout.FlatLayout`):
rank r keeps shard r of everything, Muon's momentum included. Per step:

1. `reduce_scatter` of the flat gradient, divided by N: rank r's shard of the averaged gradient (ZeRO-2);
2. on its shard, each rank runs what is element-wise: Muon's momentum and Nesterov look-ahead
   (`newton_schulz.momentum_`) and AdamW on AdamW's elements (`torch.optim.AdamW` on slices, as ZeRO-1
   does), the latter while step 3's all-to-all is in flight (the overlap this layout allows);
3. `all_to_all`: each rank sends its pieces of every matrix to the matrix's owner (`owners.greedy_owners`
   by Newton-Schulz FLOPs), which now holds whole matrices, and orthogonalises them;
4. `all_to_all` back: the owner returns every rank its pieces of the orthogonalised matrix;
5. each rank applies weight decay and the step to its shard (`newton_schulz.apply_`), and an
   `all_gather` gives every replica the new parameters (ZeRO's last step).

Steps 3-4 move only Muon's elements, each at most once each way: about M/N per rank, where M is the
matrices' size. Microsoft's Dion (torchtitan's experiments/dion_optimizer/muon.py) redistributes the
same way, shards to one whole matrix per rank by all-to-all and back; Liu et al. 2025 (Moonlight's
"Distributed Muon") instead gather each matrix on every rank of the ZeRO-1 group and let each rank
orthogonalise all of them, which repeats the work N times. Here the orthogonalised pieces travel in the
parameters' dtype (an exact copy of the bf16 result; sending bf16, as Dion does, halves those bytes).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import where
from distlab.dist_compat import all_gather_single, reduce_scatter_single
from distlab.memory.muon.common import check_parameters, gradient, same_start
from distlab.memory.muon.flat_layout import FlatLayout, Piece, elements
from distlab.memory.muon.newton_schulz import (
    MuonSettings,
    adjusted_lr,
    apply_,
    momentum_,
    newton_schulz_flops,
    zeropower_via_newtonschulz,
)
from distlab.memory.muon.owners import greedy_owners
from distlab.memory.muon.split import Named


class AllToAllMuon:
    """Muon for `muon`'s matrices and AdamW for `adamw`'s tensors over `group`, state in ZeRO's flat
    shards, each matrix orthogonalised on its owner (layout (b), see the module docstring)."""

    def __init__(self, muon: Named, adamw: Named, settings: MuonSettings | None = None,
                 group: dist.ProcessGroup | None = None) -> None:
        check_parameters(muon, adamw)
        self.settings, self.group = settings or MuonSettings(), group
        self.named = [*muon, *adamw]
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.layout = FlatLayout(tuple(p.numel() for _, p in self.named), self.n)
        self.matrices = list(range(len(muon)))
        self.owners = greedy_owners([newton_schulz_flops(p.shape, self.settings.ns_steps)
                                     for _, p in muon], self.n)
        same_start([p for _, p in self.named], group)
        first = self.named[0][1]
        self.shard = torch.zeros(self.layout.shard, dtype=first.dtype, device=first.device)
        self._load_shard()
        self.momentum = {m: torch.zeros(hi - lo, dtype=first.dtype, device=first.device)
                         for m in self.matrices for lo, hi in [self.layout.local(m, self.rank)] if hi > lo}
        self.slices = {}  # AdamW tensor index -> nn.Parameter, a view of this rank's shard
        for i in range(len(muon), len(self.named)):
            lo, hi = self.layout.local(i, self.rank)
            if hi > lo:
                self.slices[i] = nn.Parameter(self.shard[lo:hi])
        self.inner = (torch.optim.AdamW(list(self.slices.values()), **self.settings.adamw_kwargs())
                      if self.slices else None)

    def _load_shard(self) -> None:
        """This rank's shard := its elements of the parameters (the replicas are equal)."""
        for i, (_, p) in enumerate(self.named):
            lo, hi = self.layout.local(i, self.rank)
            start, stop = self.layout.piece(i, self.rank)
            off = self.layout.offset(i)
            self.shard[lo:hi].copy_(p.detach().reshape(-1)[start - off:stop - off])

    def _averaged_grad_shard(self) -> Tensor:
        """Step 1: this rank's shard of the data-parallel average of the flat gradient."""
        flat = torch.zeros(self.layout.padded, dtype=self.shard.dtype, device=self.shard.device)
        for i, (name, p) in enumerate(self.named):
            off = self.layout.offset(i)
            flat[off:off + p.numel()].copy_(gradient(name, p).reshape(-1))
        out = torch.empty_like(self.shard)
        reduce_scatter_single(out, flat, group=self.group)
        return out.div_(self.n)

    def _exchange(self, take: Callable[[int, int, int], Tensor], send: list[list[Piece]],
                  recv: list[list[Piece]]) -> tuple[Tensor, dist.Work]:
        """Start one all-to-all: `take(m, start, stop)` for each piece of `send[q]` goes to rank q; returns
        the buffer that receives the pieces of `recv[r]` from each rank r in turn, and the work to wait on."""
        chunks = [take(*piece) for pieces in send for piece in pieces]
        inp = torch.cat(chunks) if chunks else self.shard.new_empty(0)
        out = self.shard.new_empty(sum(elements(p) for p in recv))
        work = dist.all_to_all_single(out, inp, output_split_sizes=[elements(p) for p in recv],
                                      input_split_sizes=[elements(p) for p in send], group=self.group,
                                      async_op=True)
        return out, work

    @torch.no_grad()
    def step(self) -> None:
        """Steps 1-5 of the module docstring."""
        s, lay, r = self.settings, self.layout, self.rank
        with where("muon.all_to_all"):
            self._load_shard()
            grad = self._averaged_grad_shard()
            update = torch.zeros_like(self.shard)
            for m, buf in self.momentum.items():
                lo, hi = lay.local(m, r)
                update[lo:hi] = momentum_(buf, grad[lo:hi], s.momentum, s.nesterov)
            send = lay.sends(r, self.matrices, self.owners)
            recv = lay.receives(r, self.matrices, self.owners)
            mine = [m for m, q in zip(self.matrices, self.owners, strict=True) if q == r]
            base = r * lay.shard
            arrived, work = self._exchange(lambda m, a, b: update[a - base:b - base], send, recv)
            self._adamw_step(grad)  # element-wise, while the matrices' pieces travel
            work.wait()
            ortho = self._orthogonalise(mine, arrived, recv)
            back, work = self._exchange(lambda m, a, b: ortho[m][a - lay.offset(m):b - lay.offset(m)],
                                        recv, send)
            work.wait()
            self._apply(back, send)
            full = torch.empty(lay.padded, dtype=self.shard.dtype, device=self.shard.device)
            all_gather_single(full, self.shard, group=self.group)
            for i, (_, p) in enumerate(self.named):
                off = lay.offset(i)
                p.detach().copy_(full[off:off + p.numel()].view_as(p))

    def _adamw_step(self, grad: Tensor) -> None:
        """Step 2's AdamW: torch.optim.AdamW on this rank's slices of AdamW's tensors."""
        for i, param in self.slices.items():
            lo, hi = self.layout.local(i, self.rank)
            param.grad = grad[lo:hi]
        if self.inner is not None:
            self.inner.step()

    def _orthogonalise(self, mine: list[int], arrived: Tensor, recv: list[list[Piece]]) -> dict[int, Tensor]:
        """Step 3's end: each matrix this rank owns, whole from the arrived pieces, orthogonalised (flat)."""
        whole = {m: self.shard.new_empty(self.named[m][1].numel()) for m in mine}
        at = 0
        for pieces in recv:
            for m, start, stop in pieces:
                off = self.layout.offset(m)
                whole[m][start - off:stop - off] = arrived[at:at + stop - start]
                at += stop - start
        s = self.settings
        return {m: zeropower_via_newtonschulz(u.view_as(self.named[m][1]), s.ns_coefficients, s.ns_steps,
                                              s.eps).to(u.dtype).reshape(-1) for m, u in whole.items()}

    def _apply(self, back: Tensor, send: list[list[Piece]]) -> None:
        """Step 5's first half: weight decay and the orthogonalised step on this rank's Muon pieces."""
        s, at = self.settings, 0
        base = self.rank * self.layout.shard
        for pieces in send:
            for m, start, stop in pieces:
                lr = adjusted_lr(s.lr, s.adjust_lr_fn, self.named[m][1].shape)
                apply_(self.shard[start - base:stop - base], back[at:at + stop - start], s.lr,
                       s.weight_decay, lr)
                at += stop - start

    def zero_grad(self) -> None:
        """Forget every parameter's gradient."""
        for _, p in self.named:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes of optimizer state on this rank: Muon's momentum on its shard, AdamW's moments on it."""
        total = sum(b.numel() * b.element_size() for b in self.momentum.values())
        if self.inner is not None:
            for state in self.inner.state.values():
                total += sum(state[k].numel() * state[k].element_size() for k in ("exp_avg", "exp_avg_sq"))
        return total
