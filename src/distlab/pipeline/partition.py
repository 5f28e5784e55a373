"""Cut a model's layers into consecutive pipeline stages, balanced by a cost per layer.

A pipeline runs only as fast as its slowest stage, so the cut should make the largest stage cost as
small as possible (GPipe partitions by estimated cost to balance the stages, Huang et al. 2019, sec.
2.2). For a sequence of layer costs c_0..c_{L-1} and S stages this is the *linear partition* problem,
solved exactly by dynamic programming in O(S L^2): among all cuts into S non-empty runs of consecutive
layers, take one whose largest run sum is smallest, and among those, one whose largest run has the
fewest layers (so free layers such as activations are spread out rather than piled up).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


def parameter_costs(layers: Sequence[nn.Module]) -> list[float]:
    """The cost of each layer as its parameter count (a proxy for its FLOPs and for its memory)."""
    return [float(sum(p.numel() for p in layer.parameters())) for layer in layers]


def balanced_boundaries(costs: Sequence[float], num_stages: int) -> list[int]:
    """Boundaries b_0 = 0 < b_1 < ... < b_S = L such that stage s holds layers [b_s, b_{s+1}), chosen so
    that the costliest stage is as cheap as possible (ties: the stage with most layers is smallest)."""
    L = len(costs)
    _check_partition(costs, num_stages)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    cut = _best_cuts(prefix, num_stages)
    bounds = [L]
    for s in range(num_stages, 0, -1):
        bounds.append(cut[s][bounds[-1]])
    return bounds[::-1]


def _check_partition(costs: Sequence[float], num_stages: int) -> None:
    """Every cost a finite number >= 0; num_stages a positive integer, at most one stage per layer."""
    L = len(costs)
    for i, c in enumerate(costs):
        if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c < 0:
            raise ValueError(f"costs[{i}]={c!r} must be a finite number >= 0 (a layer's time or FLOPs); "
                             "measure or estimate every layer's cost, 0 for a layer that costs nothing")
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages={num_stages!r} must be a positive integer, e.g. the number of ranks")
    if num_stages > L:
        raise ValueError(f"num_stages={num_stages} is more than the {L} layers of the model: every stage "
                         f"needs at least one layer; use at most {L} stages (p * v <= {L}) or a deeper model")


def _best_cuts(prefix: list[float], num_stages: int) -> list[list[int]]:
    """The dynamic program over the prefix sums of the L costs: cut[s][j] is where the last of s stages
    begins in the best split of layers [0, j) into s stages."""
    L = len(prefix) - 1
    inf = (float("inf"), L + 1)
    # best[s][j]: the best (max cost, max layers) for putting layers [0, j) into s stages; cut[s][j]: last cut
    best = [[inf] * (L + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (L + 1) for _ in range(num_stages + 1)]
    best[0][0] = (0.0, 0)
    for s in range(1, num_stages + 1):
        for j in range(s, L + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == inf:
                    continue
                cand = (max(best[s - 1][i][0], prefix[j] - prefix[i]), max(best[s - 1][i][1], j - i))
                if cand < best[s][j]:
                    best[s][j], cut[s][j] = cand, i
    return cut


def check_boundaries(boundaries: Sequence[int], num_layers: int) -> list[int]:
    """Check explicit boundaries [0, b_1, ..., L] and return them as a list: every layer in exactly one
    stage, none skipped (the first is 0, the last L), none repeated and no stage empty (strictly rising)."""
    b = list(boundaries)
    example = f"e.g. [0, {num_layers // 2}, {num_layers}] for two stages"
    if len(b) < 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in b):
        raise ValueError(f"boundaries={b} must be at least two integers [0, ..., {num_layers}], one more "
                         f"than stages; {example}")
    if b[0] != 0 or b[-1] != num_layers:
        raise ValueError(f"boundaries={b} must start at 0 and end at the number of layers {num_layers}, or "
                         f"layers outside [{b[0]}, {b[-1]}) would be skipped or invented; {example}")
    for s, (lo, hi) in enumerate(zip(b, b[1:], strict=False)):
        if lo >= hi:
            what = "would be empty" if lo == hi else f"goes backwards: layers {hi}..{lo - 1} would run twice"
            raise ValueError(f"boundaries={b}: stage {s}, layers [{lo}, {hi}), {what}; boundaries must "
                             f"rise strictly, {example}")
    return b


def stage_modules(layers: Sequence[nn.Module], boundaries: Sequence[int]) -> list[nn.Sequential]:
    """Stage s as `nn.Sequential(*layers[b_s:b_{s+1}])` (the same module objects, not copies)."""
    b = check_boundaries(boundaries, len(layers))
    return [nn.Sequential(*layers[b[s]:b[s + 1]]) for s in range(len(b) - 1)]


def boundary_shapes(layers: Sequence[nn.Module], boundaries: Sequence[int],
                    sample: torch.Tensor) -> list[torch.Size]:
    """The shape of each stage's input for an input shaped like `sample` (one microbatch): what a rank
    must allocate to receive it. Found by running the layers once without autograd."""
    shapes = []
    x = sample
    with torch.no_grad():
        for module in stage_modules(layers, boundaries):
            shapes.append(x.shape)
            x = module(x)
    return shapes
