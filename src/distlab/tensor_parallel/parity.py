"""Check, on a rank, that the tensor-parallel GPT computes what the dense one does.

`compare_with_dense` builds `distlab.models.GPT` from a seed on every rank (it is small), loads its
weights into a `ParallelGPT` shard, runs forward and backward through both on the same batch, and
reports the largest differences: the logits (gathered over the vocabulary), the loss, and every gradient
(each rank's gradient against the same shard of the dense gradient). It also hands back this rank's
weight shard and the communication a `distlab.comm_log` recorded during the parallel step, so that the
caller can rebuild the dense weights (`gather_state_dict`) and count the bytes (`cost_model`).

The differences themselves depend on the machine (the BLAS kernels, the number of threads): a lab prints
`ParityReport.verdict()`, the claim against the stated tolerance, which does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.comm_log import CommRecord, comm_log
from distlab.models import GPT, GPTConfig
from distlab.tensor_parallel.comm import Group, gather_last_dim
from distlab.tensor_parallel.model import ParallelGPT, grads_of, shard_state_dict

# float64 keeps ~16 digits and the two models add the same terms in another order: differences are a
# few 1e-16, so 1e-10 is far above rounding and far below a real mistake (O(1e-2) here); float32 keeps
# ~7 digits, hence 1e-5.
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


@dataclass
class ParityReport:
    """The largest absolute differences between the parallel and the dense model on one rank.

    `outputs` holds what the parallel model computed on this rank (the logits gathered over the
    vocabulary, the loss, and this rank's gradient shards), for comparing two parallel runs.
    """

    tp_size: int
    sequence_parallel: bool
    dtype: str
    logits: float
    loss: float
    grads: dict[str, float]
    records: list[CommRecord] = field(default_factory=list)
    shard: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)

    @property
    def worst_grad(self) -> float:
        return max(self.grads.values())

    def worst(self) -> float:
        """The largest difference of all: logits, loss and every gradient (nan if any is nan)."""
        diffs = [self.logits, self.loss, *self.grads.values()]
        return math.nan if any(math.isnan(d) for d in diffs) else max(diffs)

    @property
    def label(self) -> str:
        return f"tp={self.tp_size} {'SP ' if self.sequence_parallel else ''}{self.dtype}"

    def passed(self, tol: float | None = None) -> bool:
        """Every difference within `tol` (default: the dtype's, `TOLERANCE`)."""
        return self.worst() < (TOLERANCE[self.dtype] if tol is None else tol)  # False for nan

    def verdict(self, tol: float | None = None) -> str:
        """One line that is the same on every machine: the claim checked and ok, or what failed."""
        tol = TOLERANCE[self.dtype] if tol is None else tol
        head = f"{self.label}: logits, loss and all {len(self.grads)} gradients agree within {tol:g}"
        if self.passed(tol):
            return head + ": ok"
        bad = sorted(n for n, d in self.grads.items() if not d < tol)
        parts = [n for n, d in (("logits", self.logits), ("loss", self.loss)) if not d < tol] + bad
        return f"{head}: FAILED for {', '.join(parts[:4])}{' ...' if len(parts) > 4 else ''}"

    def __str__(self) -> str:
        """The magnitudes (they differ from machine to machine: print `verdict()` in a lab)."""
        name = max(self.grads, key=self.grads.get)
        return (f"{self.label}: max |diff| logits {self.logits:.1e}, loss {self.loss:.1e}, gradients "
                f"{self.worst_grad:.1e} ({name})")


def max_abs_diff(a: Tensor, b: Tensor) -> float:
    """max |a - b|, where a nan in both at the same place counts as agreement (F.cross_entropy's loss is
    nan when every target is ignored, and so is the parallel one's); a nan in one only gives nan."""
    a, b = a.detach(), b.detach()
    both = a.isnan() & b.isnan()
    return float((a - b).masked_fill(both, 0.0).abs().max()) if a.numel() else 0.0


def make_batch(config: GPTConfig, batch: int, seq: int, seed: int) -> tuple[Tensor, Tensor]:
    """Random token ids and next-token targets, (batch, seq) each, the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(config.vocab_size, (batch, seq + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


def compare_with_dense(config: GPTConfig, batch: int = 2, seq: int = 8, seed: int = 0,
                       dtype: torch.dtype = torch.float64, sequence_parallel: bool = False,
                       device: torch.device | str = "cpu", *, group: Group = None,
                       targets: Tensor | None = None) -> ParityReport:
    """One forward and backward step of GPT and of ParallelGPT (tensor-parallel over `group`, None = the
    world or one process) on the same weights and batch; the differences on this rank. Call it on every
    rank of `group` (it runs collectives). `targets` replaces the batch's next tokens (e.g. with some
    set to -100, which both models ignore)."""
    torch.manual_seed(seed)
    dense = GPT(config).to(device=device, dtype=dtype)
    idx, next_tokens = (t.to(device) for t in make_batch(config, batch, seq, seed + 1))
    targets = next_tokens if targets is None else targets.to(device)
    model = ParallelGPT.from_dense(dense, group=group, sequence_parallel=sequence_parallel)

    logits_ref, loss_ref = dense(idx, targets)
    loss_ref.backward()
    axes = {"tp": group if group is not None else dist.group.WORLD} if dist.is_initialized() else {}
    with comm_log(groups=axes) as log:  # one training step: forward and backward
        logits, loss = model(idx, targets)
        loss.backward()
        model.allreduce_sequence_parallel_grads()
    records = log.records
    full = gather_last_dim(logits.detach(), group)

    want = shard_state_dict(grads_of(dense), config, model.tp_rank, model.tp_size)
    got = grads_of(model)
    if set(want) != set(got):
        raise RuntimeError(f"gradients differ in names: dense-only {sorted(set(want) - set(got))}, "
                           f"parallel-only {sorted(set(got) - set(want))}")
    return ParityReport(
        tp_size=model.tp_size, sequence_parallel=sequence_parallel, dtype=str(dtype).removeprefix("torch."),
        logits=max_abs_diff(full, logits_ref), loss=max_abs_diff(loss.detach(), loss_ref.detach()),
        grads={n: max_abs_diff(got[n], want[n]) for n in want}, records=records,
        shard={n: t.detach().cpu().clone() for n, t in model.state_dict().items()},
        outputs={"logits": full.cpu(), "loss": loss.detach().cpu()} | {n: t.cpu() for n, t in got.items()})
