"""Parity of expert parallelism with the single-process reference, run inside every rank.

`expert_parallel_parity(cases, group=None)` runs several configurations in one launch (starting ranks costs
seconds, so the tests, the lab and `python -m distlab.moe` batch them). For each case every rank builds
the same reference `MoELayer` from the same seed, runs it on the *whole* batch with GShard groups equal
to the ranks' shards (so capacity is counted per rank, as the parallel layer counts it), takes its own
share with `ExpertParallelMoE.from_reference`, runs that on its own tokens, and compares:

- outputs y, row for row, and the routing (chosen experts, kept assignments);
- gradients of the input tokens, of the router (summed over ranks, since the router is replicated and
  would be all-reduced like any data-parallel weight), and of this rank's experts;
- the loss is sum(y * w) + 0.3 * aux + 0.1 * z per rank, and G times the group mean for the reference.

Everything runs in float64, where both sides compute the same sums in a different order: differences
are a few ulps (1e-15 relative), so float64's tolerance in `distlab.parity.TOLERANCE`, 1e-10, separates
rounding from a real bug by orders of magnitude. The routing is compared as the number of chosen experts
and kept flags that differ (0 within any tolerance). `MoEParityReport.verdict()` states the claim against
that tolerance in words that are the same on every machine (the differences themselves are not: print
the verdict in a lab).

`group` is the expert-parallel group (None = the whole world); `sizes[r]` is the token count of the
group's rank r, so the same cases run on the whole world or on each half of a larger one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distlab.mesh import group_rank, group_size
from distlab.moe.expert_parallel import AllToAllStats, ExpertParallelMoE
from distlab.moe.gating import load_balancing_loss
from distlab.moe.layer import MoELayer
from distlab.parity import ParityReport, compare

AUX_WEIGHT, Z_WEIGHT = 0.3, 0.1


@dataclass
class ParityCase:
    """One configuration: tokens per rank (`sizes[r]`), experts, k, capacity factor, normalisation."""

    sizes: list[int]
    num_experts: int
    k: int = 1
    capacity_factor: float = 1.25
    normalize: bool = True
    d_model: int = 8
    d_hidden: int = 16
    seed: int = 0

    def label(self) -> str:
        return (f"tokens per rank {self.sizes}, E={self.num_experts}, k={self.k}, "
                f"rho={self.capacity_factor:g}")


@dataclass
class MoEParityReport(ParityReport):
    """`distlab.parity`'s report of one rank and one case (routing, outputs, gradients, aux loss, within
    float64's tolerance), with what its all-to-alls carried and the fraction of assignments dropped."""

    case: ParityCase | None = None
    dropped: float = 0.0
    comm: AllToAllStats | None = None

    @property
    def errors(self) -> dict[str, float]:
        return self.flat()

    @property
    def same_routing(self) -> bool:
        return self.differences["routing"]["routing"] == 0


def _or_zeros(a: torch.Tensor | None, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A missing gradient (None: the tensor took no part) counts as zeros. The parallel layer runs every
    expert, even on zero rows, so its unused experts get zero gradients, not None."""
    if a is None and b is None:
        return torch.zeros(()), torch.zeros(())
    return (torch.zeros_like(b) if a is None else a), (torch.zeros_like(a) if b is None else b)


def _routing_mismatches(mine, want) -> float:
    """How many chosen experts or kept flags differ from the reference's (inf if the shapes differ)."""
    pairs = ((mine.expert_index, want.expert_index), (mine.kept, want.kept))
    if any(a.shape != b.shape for a, b in pairs):
        return math.inf
    return float(sum(int((a != b).sum()) for a, b in pairs))


def parity_one(case: ParityCase, group: dist.ProcessGroup | None = None) -> MoEParityReport:
    """Run one case on this rank (every rank of `group` must call it with the same case)."""
    r, p = group_rank(group), group_size(group)
    if len(case.sizes) != p:
        raise ValueError(f"sizes={case.sizes} must give one token count per rank ({p} ranks)")
    nccl = dist.is_initialized() and dist.get_backend(group) == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    torch.manual_seed(case.seed)
    ref = MoELayer(case.d_model, case.d_hidden, case.num_experts, case.k, case.capacity_factor,
                   case.normalize).double().to(dev)
    g = torch.Generator().manual_seed(case.seed + 1)
    x = torch.randn(sum(case.sizes), case.d_model, generator=g, dtype=torch.float64).to(dev)
    w = torch.randn(sum(case.sizes), case.d_model, generator=g, dtype=torch.float64).to(dev)
    ep = ExpertParallelMoE.from_reference(ref, group)

    x_ref = x.clone().requires_grad_()
    out = ref(x_ref, group_sizes=case.sizes)
    groups = len(case.sizes)
    ((out.y * w).sum() + groups * (AUX_WEIGHT * out.aux_loss + Z_WEIGHT * out.z_loss)).backward()

    a, b = sum(case.sizes[:r]), sum(case.sizes[:r + 1])
    x_mine = x[a:b].clone().requires_grad_()
    mine = ep(x_mine)
    ((mine.y * w[a:b]).sum() + AUX_WEIGHT * mine.aux_loss + Z_WEIGHT * mine.z_loss).backward()

    router_grad = ep.router.w_g.weight.grad.clone()
    if p > 1:
        dist.all_reduce(router_grad, group=group)
    expert_err = 0.0
    for j, expert in enumerate(ep.experts):
        twin = ref.experts[ep.first_expert + j]
        for pa, pb in zip(expert.parameters(), twin.parameters(), strict=True):
            expert_err = max(expert_err, compare(*_or_zeros(pa.grad, pb.grad), dtype=torch.float64).worst())
    x_grad, x_grad_ref = _or_zeros(x_mine.grad, x_ref.grad[a:b])
    ours = {"routing": _routing_mismatches(mine.routing, out.routings[r]), "output": mine.y,
            "input grad": x_grad, "router grad": router_grad, "expert grads": expert_err,
            "aux loss": mine.aux_loss.detach()}
    want = {"routing": 0.0, "output": out.y[a:b], "input grad": x_grad_ref,
            "router grad": ref.router.w_g.weight.grad, "expert grads": 0.0,
            "aux loss": load_balancing_loss(out.routings[r]).detach()}
    report = compare(ours, want, dtype=torch.float64, label=case.label())
    return MoEParityReport(report.differences, report.tolerance, report.dtype, report.label, case=case,
                           dropped=mine.routing.dropped_fraction(), comm=mine.comm)


def expert_parallel_parity(cases: list[ParityCase], group: dist.ProcessGroup | None = None
                           ) -> list[MoEParityReport]:
    """Run every case on this rank of `group`, in order (one launch for all of them)."""
    return [parity_one(c, group) for c in cases]
