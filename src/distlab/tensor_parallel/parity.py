"""Check, on a rank, that the tensor-parallel GPT computes what the dense one does.

`compare_with_dense` builds `distlab.models.GPT` from a seed on every rank (it is small), loads its
weights into a `ParallelGPT` shard, runs forward and backward through both on the same batch, and
reports the largest differences: the logits (gathered over the vocabulary), the loss, and every gradient
(each rank's gradient against the same shard of the dense gradient). It also hands back this rank's
weight shard and the communication the parallel step recorded, so that the caller can rebuild the dense
weights (`gather_state_dict`) and count the bytes (`accounting`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from distlab.models import GPT, GPTConfig
from distlab.tensor_parallel.comm import CommRecord, CommRecorder, TPGroup, gather_last_dim
from distlab.tensor_parallel.model import ParallelGPT, grads_of, shard_state_dict


@dataclass
class ParityReport:
    """The largest absolute differences between the parallel and the dense model on one rank."""

    tp_size: int
    sequence_parallel: bool
    dtype: str
    logits: float
    loss: float
    grads: dict[str, float]
    records: list[CommRecord] = field(default_factory=list)
    shard: dict[str, Tensor] = field(default_factory=dict)

    @property
    def worst_grad(self) -> float:
        return max(self.grads.values())

    def worst(self) -> float:
        """The largest difference of all: logits, loss and every gradient."""
        return max(self.logits, self.loss, self.worst_grad)

    def __str__(self) -> str:
        name = max(self.grads, key=self.grads.get)
        return (f"tp={self.tp_size} {'SP ' if self.sequence_parallel else ''}{self.dtype}: max |diff| logits "
                f"{self.logits:.1e}, loss {self.loss:.1e}, gradients {self.worst_grad:.1e} ({name})")


def make_batch(config: GPTConfig, batch: int, seq: int, seed: int) -> tuple[Tensor, Tensor]:
    """Random token ids and next-token targets, (batch, seq) each, the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(config.vocab_size, (batch, seq + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


def compare_with_dense(config: GPTConfig, tp: TPGroup, batch: int = 2, seq: int = 8, seed: int = 0,
                       dtype: torch.dtype = torch.float64, sequence_parallel: bool = False,
                       device: torch.device | str = "cpu") -> ParityReport:
    """One forward and backward step of GPT and of ParallelGPT on the same weights and batch; the
    differences on this rank. Call it on every rank of `tp` (it runs collectives)."""
    torch.manual_seed(seed)
    dense = GPT(config).to(device=device, dtype=dtype)
    idx, targets = (t.to(device) for t in make_batch(config, batch, seq, seed + 1))
    recorder = tp.recorder if tp.recorder is not None else CommRecorder()
    tp = TPGroup(tp.group, tp.rank, tp.size, recorder)
    model = ParallelGPT.from_dense(dense, tp, sequence_parallel)

    logits_ref, loss_ref = dense(idx, targets)
    loss_ref.backward()
    recorder.clear()  # count one training step: forward and backward
    logits, loss = model(idx, targets)
    loss.backward()
    model.allreduce_sequence_parallel_grads()
    records = list(recorder.records)
    full = gather_last_dim(logits.detach(), TPGroup(tp.group, tp.rank, tp.size))

    want = shard_state_dict(grads_of(dense), config, tp.rank, tp.size)
    got = grads_of(model)
    if set(want) != set(got):
        raise RuntimeError(f"gradients differ in names: dense-only {sorted(set(want) - set(got))}, "
                           f"parallel-only {sorted(set(got) - set(want))}")
    return ParityReport(
        tp_size=tp.size, sequence_parallel=sequence_parallel, dtype=str(dtype).removeprefix("torch."),
        logits=(full - logits_ref).abs().max().item(), loss=abs(loss.item() - loss_ref.item()),
        grads={n: (got[n] - want[n]).abs().max().item() for n in want}, records=records,
        shard={n: t.detach().cpu().clone() for n, t in model.state_dict().items()})
