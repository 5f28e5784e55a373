"""What `exercises.check_expert_parallel` does on each rank, apart from calling the student's function:
build the single-process reference (`MoELayer`, on the CPU) and say what is wrong with a rank's output
and with the gradient of its input rows, compared with that reference (`distlab.parity`, float64).

The layer is `expert_parallel.ExpertParallelMoE` (Lepikhin et al. 2021; Fedus et al. 2022, sec. 2.2): each
rank holds E / p experts and the rows travel by all-to-all. A wrong output is told apart as all zeros
(the results never came back), the experts' outputs without the gates, or rows gone astray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from distlab.parity import compare


@dataclass
class Reference:
    """One case's single-process run: the layer, the global rows and output weights, and what it gave."""

    layer: Any  # distlab.moe.layer.MoELayer
    sizes: list[int]  # the rows of each rank
    x: Tensor
    w: Tensor  # the loss is (y * w).sum()
    x_ref: Tensor  # x as the reference's leaf: its .grad is the input gradient
    out: Any  # the reference's output (y and the routings per rank)

    def rows(self, r: int) -> tuple[int, int]:
        """The first and one past the last global row of rank r."""
        return sum(self.sizes[:r]), sum(self.sizes[:r + 1])


def reference(p: int, k: int, factor: float, seed: int) -> Reference:
    """The reference run on the CPU (wherever the ranks run): 2p experts, rank q holding 4 + 3q rows."""
    from distlab.moe.layer import MoELayer

    sizes = [4 + 3 * q for q in range(p)]
    with torch.device("cpu"):
        torch.manual_seed(seed)
        ref = MoELayer(6, 12, 2 * p, k, factor).double()
        g = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(sum(sizes), 6, generator=g, dtype=torch.float64)
        w = torch.randn(sum(sizes), 6, generator=g, dtype=torch.float64)
        x_ref = x.clone().requires_grad_()
        out = ref(x_ref, group_sizes=sizes)
        (out.y * w).sum().backward()
    return Reference(ref, sizes, x, w, x_ref, out)


def output_problems(y: Any, ref: Reference, r: int) -> list[str]:
    """What is wrong with rank r's output `y` (on the CPU); [] when it equals the reference's rows."""
    a, b = ref.rows(r)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (b - a, 6):
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        return [f"rank {r} returned {shape}; return this rank's output rows, shape {(b - a, 6)}"]
    if compare(y, ref.out.y[a:b]).passed:  # float64's tolerance, distlab.parity.TOLERANCE
        return []
    if float(y.detach().abs().max()) == 0.0:
        return [f"rank {r}'s output is all zeros: did the results come back (the combine "
                "all-to-all, split sizes swapped) and get added into y?"]
    if compare(y, _unweighted(ref, r)).passed:
        return [f"rank {r}: the expert outputs were not multiplied by the gates"]
    return [f"rank {r}: output differs from the reference by up to "
            f"{compare(y, ref.out.y[a:b]).worst():.3g} (rows sent to the wrong rank, or "
            "results added to the wrong tokens?)"]


def _unweighted(ref: Reference, r: int) -> Tensor:
    """Rank r's rows as the sum of their kept experts' outputs without the gates (a mistake to recognise)."""
    a, b = ref.rows(r)
    routing = ref.out.routings[r]
    unweighted = torch.zeros_like(ref.x[a:b])
    for i, expert in enumerate(ref.layer.experts):
        tok, _ = torch.nonzero((routing.expert_index == i) & routing.kept, as_tuple=True)
        unweighted = unweighted.index_add(0, tok, expert(ref.x[a:b][tok]).detach())
    return unweighted


def gradient_problems(y_dev: Tensor, x_mine: Tensor, ref: Reference, r: int) -> list[str]:
    """Backward through rank r's (right) output `y_dev`; what is wrong with the gradient of `x_mine`."""
    a, b = ref.rows(r)
    if y_dev.requires_grad:
        (y_dev * ref.w[a:b].to(x_mine.device)).sum().backward()
    if x_mine.grad is not None and compare(x_mine.grad.cpu(), ref.x_ref.grad[a:b]).passed:
        return []
    return [f"rank {r}: the output is right but the gradient of x is "
            f"{'missing' if x_mine.grad is None else 'wrong'}: dist.all_to_all_single is "
            "not differentiable; send the rows with distlab.moe.all_to_all (or your own "
            "autograd.Function whose backward is the reverse all-to-all)"]
