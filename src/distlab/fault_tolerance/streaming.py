"""Streaming DiLoCo: the model in K fragments, each synchronised every H steps at its own time.

Douillard et al. 2025, "Streaming DiLoCo with overlapping communication: Towards a Distributed Free
Lunch" (arXiv 2501.18512). Plain DiLoCo sends the whole model at once every H steps, so the link idles for
H - 1 steps and then carries a burst of the model's size. Streaming DiLoCo splits the parameters into K
fragments (groups of layers) and runs DiLoCo's outer loop on each fragment separately, with staggered
offsets: fragment f is synchronised after inner steps t with t = t_f (mod H), t_f = floor((f + 1) H / K).
Every fragment still meets the others once per H steps, but the peak traffic is 1/K of the model. The
pseudo-gradients may travel in a lower precision (`sync_dtype=torch.bfloat16`: half the bytes; the paper
goes down to 4 bits). With K = 1 this is DiLoCo.

Not done here (torchft's `DiLoCo` does both): overlapping a fragment's all-reduce with the next tau inner
steps (`fragment_sync_delay`), and mixing local and global values (`fragment_update_alpha`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.fault_tolerance.diloco import OuterNesterov, OuterSync
from distlab.fault_tolerance.local_sgd import check_sync_every
from distlab.reference import Optimizer


def sync_offsets(sync_every: int, k: int) -> list[int]:
    """t_f = floor((f + 1) H / K) for f = 0 .. K-1: fragment f syncs after steps t = t_f (mod H)."""
    check_sync_every(sync_every)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= sync_every:
        raise ValueError(f"fragments: {k!r} fragments cannot each sync at a different step of a round of "
                         f"sync_every={sync_every} steps; use between 1 and {sync_every} fragments")
    return [(f + 1) * sync_every // k for f in range(k)]


def check_fragments(model: nn.Module, fragments: Sequence[Sequence[str]]) -> list[list[str]]:
    """Fragments as lists of parameter names that cover the model's parameters exactly once."""
    names = [n for n, _ in model.named_parameters()]
    seen: dict[str, int] = {}
    for f, fragment in enumerate(fragments):
        if isinstance(fragment, str) or not len(fragment):
            raise ValueError(f"fragments[{f}]={fragment!r} must be a non-empty list of parameter names; "
                             "build fragments with layer_fragments(model, k)")
        for name in fragment:
            if name not in names:
                raise ValueError(f"fragments[{f}] names {name!r}, which is not a parameter of the model; "
                                 f"use names from model.named_parameters(), e.g. {names[0]!r}")
            if name in seen:
                raise ValueError(f"fragments: {name!r} is in fragments {seen[name]} and {f}; put every "
                                 "parameter in exactly one fragment")
            seen[name] = f
    missing = [n for n in names if n not in seen]
    if missing:
        raise ValueError(f"fragments do not cover the model: {len(missing)} parameters are in no fragment "
                         f"(first {missing[0]!r}); add them to a fragment, or use layer_fragments(model, k)")
    return [list(fragment) for fragment in fragments]


def layer_fragments(model: nn.Module, k: int) -> list[list[str]]:
    """K contiguous fragments of the parameters in model order, of about equal element counts (the
    paper's "sequential" pattern: neighbouring layers together)."""
    named = [(n, p.numel()) for n, p in model.named_parameters()]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(named):
        raise ValueError(f"k={k!r} fragments: choose between 1 and the {len(named)} parameters of the model")
    cumulative = list(itertools.accumulate(numel for _, numel in named))
    cuts = [0]
    for j in range(1, k):  # cut after the parameter where j/K of the elements are reached
        at = next(i for i, c in enumerate(cumulative) if c * k >= j * cumulative[-1]) + 1
        cuts.append(min(max(at, cuts[-1] + 1), len(named) - (k - j)))
    cuts.append(len(named))
    return [[n for n, _ in named[a:b]] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


class StreamingDiLoCo:
    """DiLoCo's outer loop on each fragment, fragment f after inner steps t = t_f (mod H), each with its
    own outer optimizer; `step()` in place of `inner.step()`."""

    def __init__(self, model: nn.Module, inner: Optimizer, sync_every: int,
                 fragments: Sequence[Sequence[str]], outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True, group: dist.ProcessGroup | None = None,
                 sync_dtype: torch.dtype | None = None) -> None:
        self.model, self.inner = model, inner
        fragments = check_fragments(model, fragments)
        self.sync_every = check_sync_every(sync_every)
        self.offsets = sync_offsets(sync_every, len(fragments))
        params = dict(model.named_parameters())
        self.fragments = [OuterSync([params[n] for n in names],
                                    OuterNesterov(outer_lr, outer_momentum, nesterov), group, sync_dtype,
                                    label=f"streaming/fragment{f}")
                          for f, names in enumerate(fragments)]
        self.local_step = 0
        self.syncs = 0

    @property
    def pseudo_gradients(self) -> list[Tensor]:
        """Each parameter's averaged pseudo-gradient from its fragment's last outer step, in
        `model.parameters()` order (parameters whose fragment has not synchronised yet are left out)."""
        latest = {id(p): d for sync in self.fragments for p, d in zip(sync.params, sync.pseudo_gradients,
                                                                          strict=False)}
        return [latest[id(p)] for p in self.model.parameters() if id(p) in latest]

    def step(self) -> int | None:
        """One inner step; returns the fragment synchronised after it, or None."""
        self.inner.step()
        self.local_step += 1
        phase = self.local_step % self.sync_every
        for f, offset in enumerate(self.offsets):
            if phase == offset % self.sync_every:
                self.fragments[f].sync()
                self.syncs += 1
                return f
        return None
