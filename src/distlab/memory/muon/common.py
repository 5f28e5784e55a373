"""What both distributed Muon layouts check and share: the parameters they are given, the group, the
replicas' common start, and the averaged gradient's denominator."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.comm_log import where
from distlab.memory.muon.split import Named, check_matrices


def check_parameters(muon: Named, adamw: Named) -> None:
    """Muon's are matrices, no parameter is given twice, all share one dtype and device, all dense."""
    check_matrices(muon)
    seen: dict[int, str] = {}
    for name, p in [*muon, *adamw]:
        if id(p) in seen:
            raise ValueError(f"parameter {name!r} is given twice (also as {seen[id(p)]!r}); give each "
                             "parameter to Muon or to AdamW, once (split.split_parameters)")
        seen[id(p)] = name
        if p.is_sparse:
            raise ValueError(f"parameter {name!r} is sparse; distributed Muon takes dense parameters")
    kinds = {(p.dtype, p.device) for _, p in [*muon, *adamw]}
    if len(kinds) > 1:
        raise ValueError(f"the parameters have several dtypes or devices {sorted(map(str, kinds))}; "
                         "distributed Muon keeps them in one flat buffer: give it one dtype on one device")
    if not muon and not adamw:
        raise ValueError("no parameters: give Muon's matrices and AdamW's other parameters")


def same_start(params: list[Tensor], group: dist.ProcessGroup | None) -> None:
    """Every replica starts from group-rank 0's parameters (one broadcast each, labelled muon.init)."""
    with where("muon.init"), torch.no_grad():
        for p in params:
            dist.broadcast(p.detach(), group=group, group_src=0)


def gradient(name: str, p: Tensor) -> Tensor:
    """`p.grad`, or an error naming the parameter (every rank must have computed it before step())."""
    if p.grad is None:
        raise RuntimeError(f"parameter {name!r} has no gradient; every rank must run its backward "
                           "through every parameter given to distributed Muon before step()")
    return p.grad
