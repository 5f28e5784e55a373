"""Muon under tensor parallelism: a column-parallel weight's orthogonalisation needs the whole matrix.

A column-parallel linear layer Y = X A splits A by columns over the t ranks of the tp axis (Shoeybi et
al. 2019, Megatron-LM, sec. 3); torch stores A transposed (`nn.Linear.weight`, out x in), so each rank
holds a block of rows of the weight and of its gradient. Newton-Schulz is not row by row: X X^T mixes all
rows, and the orthogonalised matrix of the whole is not the stack of the blocks' orthogonalised matrices.

- `exact`: all-gather the blocks on the tp axis (t x rows x cols x e bytes of B), orthogonalise the whole
  matrix (every tp rank does the same work, or one owner does and scatters), keep this rank's rows. It
  equals one process's update bit for bit.
- `blockwise`: orthogonalise each rank's block alone, no communication. Each block is then (nearly)
  orthogonal by itself, but the rows of different blocks are not made orthogonal to each other and the
  whole is scaled by each block's own norm: an approximation. `blockwise_error` measures it on one process:
  the relative Frobenius distance from the exact update, and the cosine between the two.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.comm_log import where
from distlab.dist_compat import all_gather_single
from distlab.memory.muon.newton_schulz import EPS, NS_COEFFICIENTS, NS_STEPS, zeropower_via_newtonschulz


def orthogonalise_column_parallel(block: Tensor, group: dist.ProcessGroup | None, exact: bool = True,
                                  coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                                  steps: int = NS_STEPS, eps: float = EPS) -> Tensor:
    """This tp rank's rows of the orthogonalised update, from its `block` (rows x cols) of the update:
    `exact` gathers the whole matrix on `group` (the tp axis) first; otherwise the block alone."""
    if block.ndim != 2:
        raise ValueError(f"block has shape {tuple(block.shape)}; give this rank's rows of a weight matrix")
    if not exact:
        return zeropower_via_newtonschulz(block, coefficients, steps, eps)
    t, r = dist.get_world_size(group), dist.get_rank(group)
    whole = block.new_empty(t * block.shape[0], block.shape[1])
    with where("muon.tp_gather"):
        all_gather_single(whole.view(-1), block.contiguous().view(-1), group=group)
    ortho = zeropower_via_newtonschulz(whole, coefficients, steps, eps)
    return ortho[r * block.shape[0]:(r + 1) * block.shape[0]]


def blockwise(update: Tensor, t: int, steps: int = NS_STEPS) -> Tensor:
    """One process: the block-wise orthogonalisation of `update`, split into `t` blocks of rows."""
    if update.shape[0] % t:
        raise ValueError(f"update has {update.shape[0]} rows, not divisible by t={t}; a column-parallel "
                         "split needs rows divisible by the tp size")
    return torch.cat([zeropower_via_newtonschulz(b, steps=steps) for b in update.chunk(t, dim=0)])


def blockwise_error(update: Tensor, t: int, steps: int = NS_STEPS) -> tuple[float, float]:
    """(||B - O||_F / ||O||_F, cos(B, O)) for the block-wise update B and the exact one O = NS(U): how far
    it is, and how far its direction is (a step scaled differently is only a different learning rate)."""
    exact = zeropower_via_newtonschulz(update, steps=steps).double()
    approx = blockwise(update, t, steps).double()
    cosine = float((approx * exact).sum() / (approx.norm() * exact.norm()))
    return float((approx - exact).norm() / exact.norm()), cosine
