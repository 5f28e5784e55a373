"""Parallel folding: attention and experts laid out over the same ranks with different parallel sizes
(Liu et al. 2025, "MoE Parallel Folding", arXiv 2504.14960, sec. 3).

Attention and the experts want different splits. Attention's weights are dense and its all-reduces sit
on the critical path, so it wants a small tensor-parallel group (tp) inside a node; the experts hold
most of the parameters but each token visits only k of them, so they want many ranks of expert
parallelism (ep) and no tensor parallelism. Forcing one grid on both (ep borrowed from the data-parallel
axis, the layout of chapter 9's `grid(dp=, ep=, tp=)`) ties their sizes together. Parallel folding
gives each half of the block its own grid over the *same* world of W ranks:

    attention: tp x dp  = W    (Megatron: tp x cp x dp x pp; tp innermost)
    experts:   ep x edp = W    (Megatron: etp x ep x edp x pp; etp innermost, here etp = 1)

and "folds" them onto one another: rank r is (dp = r // tp, tp = r % tp) for attention and
(edp = r // ep, ep = r % ep) for the experts. With W = 4, tp = 2 and ep = 4 the tensor-parallel pairs
{0, 1} and {2, 3} of attention are both inside the one expert-parallel group {0, 1, 2, 3}: the experts
use all four ranks although attention's model-parallel size is 2. Between the two halves the tokens
change hands: the tp ranks of a replica hold the same tokens after attention, so each keeps 1/tp of them
for the experts (sequence parallelism's split) and the ep all-to-all moves them to the experts' ranks.

How the groups are built. torchtitan (`torchtitan/distributed/parallel_dims.py`, `ParallelDims.build_
mesh`) makes one flat mesh over the world, `init_device_mesh(device, [W])`, and unflattens it twice,
`world._unflatten(0, sizes, names)`: once into the dense ("non-EP computation") mesh and once into the
expert ("EP computation") mesh, whose ep with etp = 1 borrows the cp and tp ranks and some of dp_shard.
Megatron-Core's `parallel_state.initialize_model_parallel` builds two `RankGenerator`s over the same
world with the same order ("tp-cp-ep-dp-pp"): one for the dense layers (tp, cp, dp, pp, with ep = 1)
and one for the experts (etp, ep, edp, pp, with cp = 1), asserts that their pipeline groups are the
same, and calls `new_group` for each line of ranks of each. `fold_meshes` does what torchtitan does,
with torch's DeviceMesh: one flat mesh, unflattened into ("dp", "tp") and ("edp", "ep"); `folded_layout`
gives the same groups as lists of ranks without processes (for a lab's predict step and for tests).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from distlab import launch


class FoldedMeshes(NamedTuple):
    """The two grids of a folded layout over one world: `attention` with axes ("dp", "tp") and `experts`
    with axes ("edp", "ep"). Take a group with e.g. `meshes.experts["ep"].get_group()`."""

    attention: DeviceMesh
    experts: DeviceMesh

    def sizes(self) -> dict[str, int]:
        """{"tp": .., "dp": .., "ep": .., "edp": ..}, read from the meshes."""
        return {"tp": self.attention.size(1), "dp": self.attention.size(0),
                "ep": self.experts.size(1), "edp": self.experts.size(0)}


def _whole(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer (ranks along the {name} axis); use "
                         f"{name}=1 not to split over it")
    return value


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _check_product(world_size: int, inner: str, inner_size: int, outer: str, outer_size: int | None,
                   half: str) -> int:
    """The outer size (derived when None), or a ValueError when inner x outer is not the world."""
    if outer_size is None:
        if world_size % inner_size:
            raise ValueError(f"{inner}={inner_size} does not divide the world of {world_size} ranks, so "
                             f"{half} cannot tile it; choose {inner} among {_divisors(world_size)}")
        return world_size // inner_size
    outer_size = _whole(outer, outer_size)
    if inner_size * outer_size != world_size:
        raise ValueError(f"{inner}={inner_size} x {outer}={outer_size} = {inner_size * outer_size} ranks, "
                         f"but the world has {world_size}: {half} must cover every rank once; choose {outer}="
                         f"{world_size // inner_size if world_size % inner_size == 0 else '...'} or sizes "
                         f"whose product is {world_size}")
    return outer_size


def check_folding(world_size: int, *, tp: int, ep: int, dp: int | None = None, edp: int | None = None,
                  num_heads: int | None = None, num_experts: int | None = None) -> dict[str, int]:
    """The four sizes {"tp", "dp", "ep", "edp"} of a folded layout, checked once: tp x dp and ep x edp
    must each equal `world_size` (dp and edp are derived when not given), tp must divide `num_heads`
    (whole heads per rank, Shoeybi et al. 2019) and ep `num_experts` (the same experts per rank). Each
    ValueError names the parameter and a size that works."""
    world_size = _whole("world_size", world_size)
    tp, ep = _whole("tp", tp), _whole("ep", ep)
    dp = _check_product(world_size, "tp", tp, "dp", dp, "attention's grid tp x dp")
    edp = _check_product(world_size, "ep", ep, "edp", edp, "the experts' grid ep x edp")
    if num_heads is not None and num_heads % tp:
        raise ValueError(f"num_heads={num_heads} is not divisible by tp={tp}: attention's tensor parallelism "
                         f"gives every rank whole heads; choose tp among {_divisors(num_heads)}")
    if num_experts is not None and num_experts % ep:
        raise ValueError(f"num_experts={num_experts} is not divisible by ep={ep}: expert parallelism gives "
                         f"every rank the same number of experts; choose ep among {_divisors(num_experts)}")
    return {"tp": tp, "dp": dp, "ep": ep, "edp": edp}


def folded_layout(world_size: int, *, tp: int, ep: int, dp: int | None = None,
                  edp: int | None = None) -> dict[str, list[list[int]]]:
    """The groups of each axis as lists of global ranks, without processes, numbered as `fold_meshes`
    numbers them: `folded_layout(4, tp=2, ep=4)` is {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]],
    "ep": [[0, 1, 2, 3]], "edp": [[0], [1], [2], [3]]}."""
    s = check_folding(world_size, tp=tp, ep=ep, dp=dp, edp=edp)
    ranks = torch.arange(world_size)
    attention, experts = ranks.reshape(s["dp"], s["tp"]), ranks.reshape(s["edp"], s["ep"])
    return {"tp": attention.tolist(), "dp": attention.T.tolist(),
            "ep": experts.tolist(), "edp": experts.T.tolist()}


def rank_groups(rank: int, world_size: int, *, tp: int, ep: int) -> dict[str, list[int]]:
    """The group of each axis that global rank `rank` belongs to (what a lab asks to predict)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is outside the world of {world_size} ranks (0 .. {world_size - 1})")
    return {axis: next(g for g in groups if rank in g)
            for axis, groups in folded_layout(world_size, tp=tp, ep=ep).items()}


def fold_meshes(*, tp: int, ep: int, dp: int | None = None, edp: int | None = None,
                num_heads: int | None = None, num_experts: int | None = None,
                device_type: str | None = None) -> FoldedMeshes:
    """Both grids of a folded layout over this job's world, as torchtitan builds them: one flat DeviceMesh
    over all ranks, unflattened into ("dp", "tp") for attention and into ("edp", "ep") for the experts
    (module docstring). Call it on every rank, in the same order: creating groups is a collective."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("fold_meshes() needs a process group: call it inside a function started by "
                           "distlab.launch.run(fn, world_size) or under torchrun")
    world = dist.get_world_size()
    s = check_folding(world, tp=tp, ep=ep, dp=dp, edp=edp, num_heads=num_heads, num_experts=num_experts)
    if device_type is None:
        device_type = launch.device().type
    flat = init_device_mesh(device_type, (world,), mesh_dim_names=("world",))
    attention = flat._unflatten(0, (s["dp"], s["tp"]), ("dp", "tp"))
    experts = flat._unflatten(0, (s["edp"], s["ep"]), ("edp", "ep"))
    assert math.prod(attention.shape) == math.prod(experts.shape) == world
    return FoldedMeshes(attention, experts)
