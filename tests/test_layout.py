"""The course's one parallel layout, `distlab.layout.Layout`, and the types that expose theirs (issue 36.1):
its sizes, world size, coordinates, groups and label agree with `distlab.mesh`, and Plan3D, the planner's
candidates, the published runs, the dry run's layouts and MemoryConfig read the same sizes from it."""

from __future__ import annotations

import pytest

from distlab import launch, mesh
from distlab.dryrun.layouts import from_published
from distlab.layout import Layout
from distlab.memory.estimate.config import MemoryConfig
from distlab.parallel3d.config import Plan3D
from distlab.plan.candidates import Candidate
from distlab.plan.published import RUNS


def test_sizes_are_the_named_axes_outermost_first():
    lay = Layout(tp=4, dp=2, pp=3)
    assert lay.sizes == {"pp": 3, "dp": 2, "tp": 4}
    assert lay.axes == ("pp", "dp", "tp")
    assert (lay.world_size, lay.size("cp"), lay.size("tp")) == (24, 1, 4)
    assert lay.label() == "(dp,pp,tp)=(2,3,4)"
    assert lay.label("tp", "cp") == "(tp,cp)=(4,1)"


@pytest.mark.parametrize("sizes", [{"dp": 2, "tp": 2}, {"pp": 2, "dp": 3, "tp": 2},
                                   {"dp": 2, "cp": 2, "tp": 1}, {"dp_replicate": 2, "dp_shard": 2},
                                   {"ep": 4}])
def test_coordinates_and_groups_are_the_meshs(sizes):
    lay = Layout(**sizes)
    assert [lay.coords(r) for r in range(lay.world_size)] == [mesh.coordinates(r, **sizes)
                                                              for r in range(lay.world_size)]
    assert lay.groups() == mesh.layout(**sizes)


@pytest.mark.parametrize(("sizes", "message"), [
    ({}, "name at least one axis"),
    ({"dp": 0}, "dp=0 must be a positive integer"),
    ({"tp": True}, "tp=True must be a positive integer"),
    ({"dp": 2, "dp_shard": 2}, "dp=2 and dp_shard=2 both given"),
    ({"dp_shard": 2}, "HSDP needs both dp_replicate= and dp_shard="),
])
def test_bad_sizes_are_named(sizes, message):
    with pytest.raises(ValueError, match=message):
        Layout(**sizes)


def test_a_rank_outside_the_layout_is_named():
    with pytest.raises(ValueError, match=r"rank=4 is outside the grid of 4 ranks"):
        Layout(dp=2, tp=2).coords(4)


def test_plan3d_reads_its_layout():
    plan = Plan3D(dp=2, pp=3, tp=2, m=3)
    assert plan.layout == Layout(dp=2, pp=3, tp=2)
    assert (plan.world_size, plan.label()) == (12, "(dp,pp,tp)=(2,3,2)")
    assert Plan3D.of(Layout(dp=2, tp=2), m=2, zero_stage=1) == Plan3D(dp=2, pp=1, tp=2, m=2, zero_stage=1)


def test_candidate_memory_config_and_published_runs_read_theirs():
    c = Candidate(2, 4, 8, 2, 1, "full", 1)
    assert c.layout == Layout(dp=2, tp=4, pp=8, cp=2) and c.layout.world_size == 128
    config = MemoryConfig(params=1e9, dp=4, tp=2, pp=2, cp=2)
    assert config.layout.sizes == {"pp": 2, "dp": 4, "cp": 2, "tp": 2}
    for run in RUNS:
        assert run.layout.world_size == run.gpus, f"{run.name}: dp x tp x pp x cp is not its GPU count"
        assert run.candidate().layout == run.layout


def test_dry_layout_coordinates_are_its_plans():
    layout = from_published("megatron-146b", layers=8)
    p = layout.plan
    assert layout.layout == p.layout and layout.world_size == p.dp * p.pp * p.tp
    for rank in (0, 1, 7, layout.world_size - 1):
        assert layout.coords(rank) == mesh.coordinates(rank, pp=p.pp, dp=p.dp, tp=p.tp)
    with pytest.raises(ValueError, match=r"is not a rank of megatron-146b's"):
        layout.coords(layout.world_size)


def _mesh_round_trip() -> tuple[dict[str, int], Layout]:
    lay = Layout(dp=2, tp=2)
    m = lay.mesh()
    return {a: m.size(i) for i, a in enumerate(mesh.mesh_axes(m))}, Layout.of(m)


def test_the_mesh_it_builds_has_its_axes_and_reads_back():
    for sizes, back in launch.run(_mesh_round_trip, 4):
        assert sizes == {"dp": 2, "tp": 2}
        assert back == Layout(dp=2, tp=2)
