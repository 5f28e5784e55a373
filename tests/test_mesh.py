"""The course's one grid of process groups (`distlab.mesh`): the DeviceMesh that `grid` builds has the
groups `layout` predicts, on 1-4 ranks and on an 8-rank (2, 2, 2) grid, and bad sizes get clear errors."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.distributed as dist

from distlab import launch, mesh


def _groups_seen(**sizes: int) -> dict[str, list[int]]:
    """Inside a rank: build the grid; for each dim, the global ranks of this rank's group, checked by an
    all-reduce over that group (the sum of global ranks must equal the sum of the members)."""
    m = mesh.grid(**sizes)
    seen = {}
    for name in m.mesh_dim_names:
        group = m[name].get_group()
        members = dist.get_process_group_ranks(group)
        total = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(total, group=group)
        assert total.item() == sum(members), (name, members, total.item())
        assert m[name].get_local_rank() == members.index(dist.get_rank())
        seen[name] = members
    return seen


GRIDS = [dict(dp=1), dict(dp=2), dict(dp=3), dict(dp=2, tp=2), dict(pp=2, tp=2), dict(dp=4, tp=1),
         dict(dp=2, pp=2, tp=2)]


def _world(sizes: dict[str, int]) -> int:
    return math.prod(sizes.values())


def _describe_and_membership() -> tuple[tuple[str, ...], str, tuple[int, int, int], str]:
    """Inside a rank of 3: the default grid's dims, describe() of a (dp=1, tp=3) grid, the group helpers,
    and what group_rank says to a rank outside the group it was given."""
    m = mesh.grid()
    tp = mesh.grid(dp=1, tp=3)
    first_two = dist.new_group([0, 1])  # rank 2 is not a member
    # new_group returns on a rank once its own connections are up: without this barrier rank 0 could
    # finish and exit while rank 1 still connects to it (seen once under load: "Connection closed by peer")
    dist.barrier()
    try:
        mesh.group_rank(first_two, "tensor-parallel group")
        refused = "no error"
    except ValueError as e:
        refused = str(e)
    tp_group = tp["tp"].get_group()
    return (m.mesh_dim_names, mesh.describe(tp),
            (mesh.group_rank(tp_group), mesh.group_size(tp_group), mesh.group_size()), refused)


def _error_of(fn, *args, **kwargs) -> str:
    try:
        fn(*args, **kwargs)
    except ValueError as e:
        return str(e)
    return "no error"


def _every_check(grids: list[dict[str, int]]) -> dict:
    """Inside a rank: every grid of this world size (in the same order on every rank), then, on 3 ranks,
    the default grid and describe(), and on 4 ranks a grid whose sizes do not multiply to the world."""
    out: dict = {"grids": [_groups_seen(**sizes) for sizes in grids]}
    if dist.get_world_size() == 3:
        out["describe"] = _describe_and_membership()
    if dist.get_world_size() == 4:
        out["bad"] = _error_of(mesh.grid, dp=2, tp=3)
    return out


@functools.cache
def _ranks(world: int) -> list[dict]:
    """One launch per world size (a launch costs seconds): every check of that size at once."""
    return launch.run(_every_check, world, [g for g in GRIDS if _world(g) == world])


@pytest.mark.parametrize("sizes", GRIDS, ids=lambda g: ",".join(f"{k}={v}" for k, v in g.items()))
def test_grid_groups_match_the_layout(sizes: dict[str, int]) -> None:
    world = _world(sizes)
    expected = mesh.layout(**sizes)
    results = [r["grids"][[g for g in GRIDS if _world(g) == world].index(sizes)] for r in _ranks(world)]
    for rank, seen in enumerate(results):
        assert list(seen) == [d for d in mesh.AXIS_ORDER if d in sizes]  # outermost first
        for name, members in seen.items():
            assert members in expected[name] and rank in members


def test_grid_on_eight_ranks_keeps_tp_innermost_and_pp_outermost() -> None:
    assert _ranks(8)[5]["grids"][0] == {"pp": [1, 5], "dp": [5, 7], "tp": [4, 5]}
    assert mesh.layout(dp=2, pp=2, tp=2) == {"pp": [[0, 4], [1, 5], [2, 6], [3, 7]],
                                             "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                                             "tp": [[0, 1], [2, 3], [4, 5], [6, 7]]}


def test_grid_without_dims_is_data_parallel_over_the_world_and_describe_shows_it() -> None:
    results = [r["describe"] for r in _ranks(3)]
    names, text = results[0][:2]
    assert names == ("dp",)
    assert text == "dp (size 1): {0} {1} {2}\ntp (size 3): {0,1,2}"
    assert [r[2] for r in results] == [(0, 3, 3), (1, 3, 3), (2, 3, 3)]
    assert results[0][3] == results[1][3] == "no error"
    assert results[2][3] == ("this rank (global rank 2) is not a member of the tensor-parallel group it was "
                             "given (global ranks [0, 1]); pass each rank the group it belongs to, e.g. "
                             "mesh['tp'].get_group() for grid(..., tp=...)")


def test_a_single_process_without_torch_distributed_is_a_group_of_one() -> None:
    assert not dist.is_initialized()
    assert mesh.group_size() == 1 and mesh.group_rank() == 0


def test_coordinates_are_the_row_major_digits() -> None:
    assert mesh.coordinates(5, dp=2, pp=2, tp=2) == {"pp": 1, "dp": 0, "tp": 1}
    assert mesh.coordinates(3, tp=4) == {"tp": 3}
    for r in range(12):
        c = mesh.coordinates(r, dp=3, tp=4)
        assert c["dp"] * 4 + c["tp"] == r
    with pytest.raises(ValueError, match=r"rank=12 is outside the grid of 12 ranks \(0 .. 11\)"):
        mesh.coordinates(12, dp=3, tp=4)
    with pytest.raises(ValueError, match=r"unknown axis \(axes\) \['xp'\]"):
        mesh.coordinates(0, dp=2, xp=2)


def test_bad_sizes_name_the_dims_and_the_fix() -> None:
    for r, rank in enumerate(_ranks(4)):
        assert rank["bad"] == ("grid(dp=2, tp=3) needs 2 x 3 = 6 ranks, but the job has world_size=4; choose "
                               "axis sizes whose product is 4"), (r, rank["bad"])
    with pytest.raises(ValueError, match=r"tp=0 must be a positive integer"):
        mesh.layout(dp=2, tp=0)
    with pytest.raises(ValueError, match=r"dp=1.5 must be a positive integer"):
        mesh.layout(dp=1.5)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=r"grid\(\) needs a process group"):
        mesh.grid(dp=1)
