"""The one "is this axis in the mesh" check (`mesh.require_axes`, `mesh.mesh_axes`) and the one rank <->
coordinates function (`mesh.coordinates`), which the dry run's layouts and torch's DeviceMesh agree with."""

from __future__ import annotations

import pytest

from distlab import mesh
from distlab.dryrun import DryLayout, fake_world
from distlab.models import GPTConfig
from distlab.parallel3d.config import Plan3D

# (dp, pp, tp): trivial, powers of two, and uneven sizes that are not powers of two
LAYOUTS = [(1, 1, 1), (2, 2, 2), (3, 1, 2), (2, 3, 5), (5, 2, 3), (1, 7, 1)]


def _dry(dp: int, pp: int, tp: int) -> DryLayout:
    config = GPTConfig(vocab_size=64, block_size=8, n_layer=pp, n_head=2, n_embd=8, dropout=0.0)
    return DryLayout(f"toy {dp}x{pp}x{tp}", config, Plan3D(dp=dp, pp=pp, tp=tp), batch=dp, seq=8)


@pytest.mark.parametrize(("dp", "pp", "tp"), LAYOUTS)
def test_dry_layout_coords_is_mesh_coordinates(dp: int, pp: int, tp: int) -> None:
    layout = _dry(dp, pp, tp)
    groups = mesh.layout(dp=dp, pp=pp, tp=tp)
    for rank in range(dp * pp * tp):
        coords = layout.coords(rank)
        assert coords == mesh.coordinates(rank, dp=dp, pp=pp, tp=tp)
        assert list(coords) == ["pp", "dp", "tp"]
        # pp outermost, tp innermost: the row-major digits of the rank
        assert (coords["pp"] * dp + coords["dp"]) * tp + coords["tp"] == rank
        for axis, lines in groups.items():  # the rank sits at its coordinate in its group of each axis
            (line,) = [g for g in lines if rank in g]
            assert line.index(rank) == coords[axis]


@pytest.mark.parametrize(("dp", "pp", "tp"), [(2, 3, 1), (3, 1, 2)])
def test_coordinates_match_device_mesh(dp: int, pp: int, tp: int) -> None:
    for rank in range(dp * pp * tp):
        with fake_world(rank, dp * pp * tp):
            grid = mesh.grid(dp=dp, pp=pp, tp=tp, device_type="cpu")
            assert mesh.mesh_axes(grid) == ("pp", "dp", "tp")
            assert list(grid.get_coordinate()) == list(mesh.coordinates(rank, dp=dp, pp=pp, tp=tp).values())


def test_dry_layout_coords_names_the_layout() -> None:
    with pytest.raises(ValueError, match=r"rank=6 is not a rank of toy 3x1x2's 6 ranks; choose 0 <= rank"):
        _dry(3, 1, 2).coords(6)


def test_require_axes_names_the_call_the_axes_and_the_fix() -> None:
    with fake_world(0, 4):
        grid = mesh.grid(dp=2, tp=2, device_type="cpu")
        assert mesh.mesh_axes(grid) == ("dp", "tp")
        assert mesh.require_axes(grid, "tp", "dp", where="f(axes)") == ("dp", "tp")
        assert mesh.require_axes(grid, where="f()") == ("dp", "tp")
        with pytest.raises(ValueError) as one:
            mesh.require_axes(grid, "ep", "tp", where="f(axis='ep')")
        assert str(one.value) == ("f(axis='ep'): the mesh has no axis 'ep'; its axes are ['dp', 'tp']; build "
                                  "the mesh with distlab.mesh.grid(ep=..., ...)")
        with pytest.raises(ValueError, match=r"^g\(\): the mesh has no axes 'pp', 'cp'; its axes are "
                                             r"\['dp', 'tp'\]; use grid\(pp=2\)$"):
            mesh.require_axes(grid, "pp", "cp", where="g()", fix="use grid(pp=2)")
        with pytest.raises(ValueError, match=r"^flat_group\(axes=\['cp'\]\): the mesh has no axis 'cp'"):
            mesh.flat_group(grid, "cp")
