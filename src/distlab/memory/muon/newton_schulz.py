"""Muon's update for one matrix, written out as `torch.optim.Muon` (torch 2.13, `torch/optim/_muon.py`)
computes it, so that a distributed Muon can run its three parts on different ranks and layouts:

1. momentum, element by element (`momentum_`): B <- lerp(B, G, 1 - mu), i.e. mu B + (1 - mu) G, and the
   Nesterov look-ahead U = lerp(G, B, mu) (or U = B without Nesterov);
2. orthogonalisation, on the whole matrix (`zeropower_via_newtonschulz`): U / ||U||_F, then `ns_steps`
   quintic Newton-Schulz iterations X <- a X + (b A + c A^2) X with A = X X^T, in bfloat16, on the wide
   orientation (the transpose of a tall matrix). Coefficients (a, b, c) = (3.4445, -4.7750, 2.0315) and
   5 steps (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks");
3. the step, element by element (`apply_`): W <- W (1 - lr wd) (decoupled weight decay with the
   *unadjusted* lr), then W <- W - lr' O with lr' = lr sqrt(max(1, A / B)) for a matrix of A rows and
   B columns ("original", Jordan et al.), or lr' = 0.2 lr sqrt(max(A, B)) ("match_rms_adamw", Liu et al.
   2025, "Muon is Scalable for LLM Training", sec. 2.2).

Only step 2 needs the whole matrix. Steps 1 and 3 work on any slice, which is what lets the flat ZeRO
layout keep Muon's momentum sharded (`all_to_all.py`). `newton_schulz_flops` counts step 2's matrix
products, the work an owner rank does (`owners.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

# torch.optim.Muon's defaults (torch/optim/_muon.py, from Jordan et al. 2024's muon.py)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-7


@dataclass(frozen=True)
class MuonSettings:
    """Muon's hyper-parameters, with `torch.optim.Muon`'s names and defaults, and the AdamW that takes
    the other parameters (embeddings, the output head, biases, norms; `split.split_parameters`)."""

    lr: float = 1e-3
    weight_decay: float = 0.1
    momentum: float = 0.95
    nesterov: bool = True
    ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS
    eps: float = EPS
    ns_steps: int = NS_STEPS
    adjust_lr_fn: str | None = None
    adamw_lr: float = 3e-4
    adamw_betas: tuple[float, float] = (0.9, 0.999)
    adamw_eps: float = 1e-8
    adamw_weight_decay: float = 0.01

    def muon_kwargs(self) -> dict:
        """The keyword arguments of `torch.optim.Muon` for these settings."""
        return {"lr": self.lr, "weight_decay": self.weight_decay, "momentum": self.momentum,
                "nesterov": self.nesterov, "ns_coefficients": self.ns_coefficients, "eps": self.eps,
                "ns_steps": self.ns_steps, "adjust_lr_fn": self.adjust_lr_fn}

    def adamw_kwargs(self) -> dict:
        """The keyword arguments of `torch.optim.AdamW` for these settings."""
        return {"lr": self.adamw_lr, "betas": self.adamw_betas, "eps": self.adamw_eps,
                "weight_decay": self.adamw_weight_decay}


def momentum_(buf: Tensor, grad: Tensor, momentum: float, nesterov: bool) -> Tensor:
    """Step 1 on any slice: update the momentum buffer `buf` in place and return what is orthogonalised."""
    buf.lerp_(grad, 1 - momentum)
    return grad.lerp(buf, momentum) if nesterov else buf


def zeropower_via_newtonschulz(update: Tensor, coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                               steps: int = NS_STEPS, eps: float = EPS) -> Tensor:
    """Step 2: the approximate orthogonalisation U S' V^T of a whole matrix (Jordan et al. 2024), bf16."""
    if update.ndim != 2:
        raise ValueError(f"update has shape {tuple(update.shape)}; Newton-Schulz orthogonalises a matrix "
                         "(2 dims): give Muon matrices and the other parameters to AdamW")
    a, b, c = coefficients
    x = update.bfloat16()
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: tuple[int, ...] | torch.Size) -> float:
    """Step 3's learning rate for a matrix of `shape` (rows A, columns B), as torch.optim.Muon's."""
    rows, cols = shape[0], shape[1]
    if adjust_lr_fn in (None, "original"):
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"adjust_lr_fn={adjust_lr_fn!r} is not one of torch.optim.Muon's; choose None, "
                     "'original' or 'match_rms_adamw'")


def apply_(param: Tensor, ortho: Tensor, lr: float, weight_decay: float, lr_adjusted: float) -> None:
    """Step 3 on any slice: decoupled weight decay, then the orthogonalised step (in place)."""
    param.mul_(1 - lr * weight_decay)
    param.add_(ortho, alpha=-lr_adjusted)


def muon_matrix_step_(param: Tensor, grad: Tensor, buf: Tensor, s: MuonSettings) -> None:
    """Steps 1-3 on one whole matrix: what torch.optim.Muon does to each parameter."""
    update = momentum_(buf, grad, s.momentum, s.nesterov)
    ortho = zeropower_via_newtonschulz(update, s.ns_coefficients, s.ns_steps, s.eps)
    apply_(param, ortho, s.lr, s.weight_decay, adjusted_lr(s.lr, s.adjust_lr_fn, param.shape))


def newton_schulz_flops(shape: tuple[int, ...], steps: int = NS_STEPS) -> int:
    """Floating-point operations of step 2's matrix products on a matrix of `shape` (2 per multiply-add).

    With m = min(rows, cols) and n = max: per iteration X X^T is 2 m^2 n, A A is 2 m^3 and the product
    with X another 2 m^2 n, so 4 m^2 n + 2 m^3 per iteration (the scalings and additions, O(m n), left
    out)."""
    m, n = sorted((int(shape[0]), int(shape[1])))
    return steps * (4 * m * m * n + 2 * m ** 3)
