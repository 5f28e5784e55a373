"""Check, on a rank, that the tensor-parallel GPT computes what the dense one does.

`compare_with_dense` builds `distlab.models.GPT` from a seed on every rank (it is small), loads its
weights into a `ParallelGPT` shard, runs forward and backward through both on the same batch, and
reports the largest differences: the logits (gathered over the vocabulary), the loss, and every gradient
(each rank's gradient against the same shard of the dense gradient). It also hands back this rank's
weight shard and the communication a `distlab.comm_log` recorded during the parallel step, so that the
caller can rebuild the dense weights (`gather_state_dict`) and count the bytes (`cost_model`).

The differences themselves depend on the machine (the BLAS kernels, the number of threads): a lab prints
`verdict()`, the claim against the stated tolerance (`distlab.parity`), which does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.comm_log import CommRecord, comm_log
from distlab.models import GPT, GPTConfig
from distlab.parity import ParityReport, compare
from distlab.tensor_parallel.collective_matmul import overlap_collective_matmuls
from distlab.tensor_parallel.comm import Group, gather_last_dim
from distlab.tensor_parallel.model import ParallelGPT, grads_of, shard_state_dict


@dataclass
class TPParityReport(ParityReport):
    """`distlab.parity`'s report of one rank's step (logits, loss and every gradient, against the dense
    model, within the dtype's `TOLERANCE`), with what the parallel model computed on this rank.

    `outputs` holds the logits gathered over the vocabulary, the loss, and this rank's gradient shards,
    for comparing two parallel runs; `shard` its weight shard.
    """

    tp_size: int = 1
    sequence_parallel: bool = False
    records: list[CommRecord] = field(default_factory=list)
    shard: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)

    @property
    def grads(self) -> dict[str, float]:
        """The largest difference of each gradient, by parameter name."""
        return self.differences["gradients"]


def make_batch(config: GPTConfig, batch: int, seq: int, seed: int) -> tuple[Tensor, Tensor]:
    """Random token ids and next-token targets, (batch, seq) each, the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(config.vocab_size, (batch, seq + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


def compare_with_dense(config: GPTConfig, batch: int = 2, seq: int = 8, seed: int = 0,
                       dtype: torch.dtype = torch.float64, sequence_parallel: bool = False,
                       device: torch.device | str = "cpu", *, group: Group = None,
                       targets: Tensor | None = None, collective_matmul: bool = False) -> TPParityReport:
    """One forward and backward step of GPT and of ParallelGPT (tensor-parallel over `group`, None = the
    world or one process) on the same weights and batch; the differences on this rank. Call it on every
    rank of `group` (it runs collectives). `targets` replaces the batch's next tokens (e.g. with some
    set to -100, which both models ignore). `collective_matmul=True` (with sequence parallelism) runs
    the layers as overlapped collective matmuls (`collective_matmul.overlap_collective_matmuls`)."""
    torch.manual_seed(seed)
    dense = GPT(config).to(device=device, dtype=dtype)
    idx, next_tokens = (t.to(device) for t in make_batch(config, batch, seq, seed + 1))
    targets = next_tokens if targets is None else targets.to(device)
    model = ParallelGPT.from_dense(dense, group=group, sequence_parallel=sequence_parallel)
    if collective_matmul:
        overlap_collective_matmuls(model)

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
    # a loss over targets that are all ignored is nan in both models: that agrees (equal_nan)
    report = compare({"logits": full, "loss": loss.detach(), "gradients": got},
                     {"logits": logits_ref, "loss": loss_ref.detach(), "gradients": want}, dtype=dtype,
                     label=f"tp={model.tp_size} {'SP ' if sequence_parallel else ''}"
                           f"{str(dtype).removeprefix('torch.')}", equal_nan=True)
    return TPParityReport(
        report.differences, report.tolerance, report.dtype, report.label,
        tp_size=model.tp_size, sequence_parallel=sequence_parallel, records=records,
        shard={n: t.detach().cpu().clone() for n, t in model.state_dict().items()},
        outputs={"logits": full.cpu(), "loss": loss.detach().cpu()} | {n: t.cpu() for n, t in got.items()})
