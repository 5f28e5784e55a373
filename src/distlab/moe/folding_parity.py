"""Parity of the folded block (`folded_block.FoldedMoEBlock`) with the single-process `MoEBlock`, run
inside every rank (Liu et al. 2025, arXiv 2504.14960: attention on tp x dp, experts on ep x edp).

For each `FoldCase` every rank builds the same reference from the same seed and the whole batch, the
folded layout's two meshes (`folding.fold_meshes`), and its share of the block; it runs its dp replica's
sequences, then compares, after `reduce_gradients`:

- the output rows and the gradient of its input rows;
- every parameter's gradient, whole: attention's shards gathered over tp, the experts over ep;
- the routing of its slice of tokens (chosen experts and kept flags; 0 mismatches in any tolerance).

The losses. Replica d's loss is R_d = sum(y_d * w_d) + sum over its tp ranks t of (0.3 aux_t + 0.1 z_t),
each rank adding its own slice's aux and z losses; the objective is the mean over the dp replicas,
J = (1/dp) sum_d R_d. The reference routes the whole batch in GShard groups equal to the ranks' slices,
in rank order (rank r = d tp + t holds slice t of replica d), so that its group means of the aux and z
losses times the world size W add the same terms: J = (1/dp) (sum(y w) + W (0.3 aux + 0.1 z)).

float64 throughout: the two sides add the same terms in other orders, a few ulps apart, and
`distlab.parity.TOLERANCE[torch.float64]` (1e-10) separates that from a bug by orders of magnitude.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from distlab import launch
from distlab.moe.folded_block import FoldedMoEBlock, MoEBlock, token_slices
from distlab.moe.folding import FoldedMeshes, fold_meshes, rank_groups
from distlab.parity import ParityReport, compare

AUX_WEIGHT, Z_WEIGHT = 0.3, 0.1


@dataclass
class FoldCase:
    """One folded layout and batch: attention's tp, the experts' ep (dp and edp fill the world),
    sequences per dp replica (`batch[d]`, one entry per replica; they may differ), and the block's shape."""

    tp: int
    ep: int
    batch: list[int]
    seq_len: int = 5
    num_experts: int = 4
    k: int = 2
    capacity_factor: float = 2.0
    n_head: int = 4
    d_model: int = 12
    d_hidden: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.batch or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batch):
            raise ValueError(f"batch={self.batch!r} must list at least one sequence for every dp replica "
                             "(positive integers, one per replica), e.g. batch=[2, 1] for dp=2")

    def label(self) -> str:
        return (f"tp={self.tp}, ep={self.ep}, sequences per replica {self.batch} x {self.seq_len}, "
                f"E={self.num_experts}, k={self.k}")

    def reference(self) -> MoEBlock:
        """The single-process block, the same on every rank (seeded)."""
        torch.manual_seed(self.seed)
        return MoEBlock(self.d_model, self.n_head, self.d_hidden, self.num_experts, self.k,
                        self.capacity_factor).double()

    def data(self) -> tuple[Tensor, Tensor]:
        """The whole batch x (sum(batch), seq_len, d_model) and the loss weights w, the same everywhere."""
        gen = torch.Generator().manual_seed(self.seed + 1)
        shape = (sum(self.batch), self.seq_len, self.d_model)
        return (torch.randn(shape, generator=gen, dtype=torch.float64),
                torch.randn(shape, generator=gen, dtype=torch.float64))

    def group_sizes(self) -> list[int]:
        """Tokens per rank in rank order: replica d's tokens cut into tp slices (the reference's groups)."""
        return [n for b in self.batch for n in token_slices(b * self.seq_len, self.tp)]


@dataclass
class FoldResult:
    """One rank's verdict on one case, with what a lab shows: its groups and its experts."""

    case: FoldCase
    rank: int
    report: ParityReport
    groups: dict[str, list[int]] = field(default_factory=dict)
    experts: list[int] = field(default_factory=list)
    tokens: int = 0

    @property
    def passed(self) -> bool:
        return self.report.passed


def _routing_mismatches(mine, want) -> float:
    pairs = ((mine.expert_index, want.expert_index), (mine.kept, want.kept))
    if any(a.shape != b.shape for a, b in pairs):
        return math.inf
    return float(sum(int((a != b).sum()) for a, b in pairs))


def run_case(case: FoldCase, meshes: FoldedMeshes) -> tuple[dict, dict, FoldedMoEBlock]:
    """Run one case on this rank: (ours, the reference's), ready for `distlab.parity.compare`, and the
    rank's block. Every rank must call it with the same case and meshes."""
    sizes = meshes.sizes()
    if len(case.batch) != sizes["dp"]:
        raise ValueError(f"batch={case.batch} must give one sequence count per dp replica (dp={sizes['dp']} "
                         f"with tp={sizes['tp']}); pass {sizes['dp']} numbers")
    dev = launch.device()
    ref, (x, w) = case.reference().to(dev), (t.to(dev) for t in case.data())
    x_ref = x.clone().requires_grad_()
    out = ref(x_ref, case.group_sizes())
    world = len(case.group_sizes())
    objective = (out.y * w).sum() + world * (AUX_WEIGHT * out.aux_loss + Z_WEIGHT * out.z_loss)
    (objective / sizes["dp"]).backward()

    block = FoldedMoEBlock.from_reference(ref, meshes)
    d = meshes.attention["dp"].get_local_rank()
    rows = slice(sum(case.batch[:d]), sum(case.batch[:d + 1]))
    x_mine = x[rows].clone().requires_grad_()
    mine = block(x_mine)
    ((mine.y * w[rows]).sum() + AUX_WEIGHT * mine.aux_loss + Z_WEIGHT * mine.z_loss).backward()
    block.reduce_gradients(meshes)

    rank = dist.get_rank()
    ours = {"output": mine.y.detach(), "input grad": x_mine.grad / sizes["dp"],
            "gradients": block.full_gradients(meshes),
            "routing": _routing_mismatches(mine.routings[0], out.routings[rank])}
    want = {"output": out.y[rows].detach(), "input grad": x_ref.grad[rows],
            "gradients": {n: torch.zeros_like(p) if p.grad is None else p.grad  # an expert no token chose
                          for n, p in ref.named_parameters()}, "routing": 0.0}
    return ours, want, block


def fold_parity_one(case: FoldCase) -> FoldResult:
    """Build the case's folded meshes over this job's world, run it, and report (on every rank)."""
    meshes = fold_meshes(tp=case.tp, ep=case.ep, num_heads=case.n_head, num_experts=case.num_experts)
    ours, want, block = run_case(case, meshes)
    report = compare(ours, want, dtype=torch.float64, label=case.label(), against="one process")
    rank, world = dist.get_rank(), dist.get_world_size()
    first = block.moe.first_expert
    return FoldResult(case, rank, report, rank_groups(rank, world, tp=case.tp, ep=case.ep),
                      list(range(first, first + block.moe.experts_per_rank)), mine_tokens(case, rank))


def mine_tokens(case: FoldCase, rank: int) -> int:
    """How many tokens global rank `rank` routes in the MoE region: its slice of its replica's tokens."""
    return case.group_sizes()[rank]


def fold_parity(cases: list[FoldCase]) -> list[FoldResult]:
    """Every case on this rank, in order (one launch for all of them)."""
    return [fold_parity_one(c) for c in cases]
