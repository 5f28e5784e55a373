"""One parallel layout: how many ranks along each axis of the job's grid, and what follows from that.

A `Layout` is the sizes alone, no process: `Layout(dp=2, pp=2, tp=2)` is 8 ranks, and only the axes
named are in it (size 1 is allowed, and keeps the axis, as `distlab.mesh.grid` keeps it). Everything the
course derives from those sizes is derived here, once: the world size, a rank's coordinates, the groups
of every axis as global ranks, the torch `DeviceMesh` it builds on a running job, and a label. The axes
are `distlab.mesh`'s (`AXIS_ORDER`, pp outermost and tp innermost, and HSDP's `dp_replicate` x
`dp_shard` in dp's place); so are the checks on the sizes and their messages. torchtitan keeps the same
one object (`ParallelDims`) that every consumer reads.

A mixture of experts may split its experts differently over the same ranks (parallel folding, Liu et al.
2025): `Layout(dp=128, pp=16, experts=ExpertFold(ep=64))` (`distlab.expert_fold`) keeps attention's
sizes as the axes and derives the experts' edp = world / (pp ep etp) (`edp`, `expert_sizes`).

Chapter 9's `Plan3D` and planner candidates, its published runs, chapter 12's dry-run layouts and chapter
7's `MemoryConfig` each expose theirs as `.layout`. "Is this axis in the mesh" is asked of a running
mesh, not of sizes: `distlab.mesh.require_axes` is that one check and its message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cached_property

from torch.distributed.device_mesh import DeviceMesh

from distlab import mesh as meshes
from distlab.expert_fold import ExpertFold


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Ranks along each named axis (None: the axis is not in the layout); at least one axis is named."""

    dp: int | None = None
    pp: int | None = None
    tp: int | None = None
    cp: int | None = None
    ep: int | None = None
    dp_replicate: int | None = None
    dp_shard: int | None = None
    experts: ExpertFold | None = None  # the experts' own ep x etp over the same ranks (`expert_fold`)

    def __post_init__(self) -> None:
        meshes.layout_sizes(self._given(), None)  # raises, naming the axis and the fix
        if self.experts is not None:
            if self.ep is not None:
                raise ValueError("give the experts' sizes once: either the ep axis (ep=, a mesh axis of its "
                                 "own) or experts=ExpertFold(ep=, etp=) folded over the other axes, not both")
            self.experts.edp(self.world_size, self.size("pp"))  # raises, naming the sizes and the fix

    def _given(self) -> dict[str, int | None]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "experts"}

    @property
    def edp(self) -> int:
        """The experts' data-parallel size under `experts` (world / (pp ep etp)); without a fold, the
        ranks that hold the same experts are the dp ranks: dp (x the ep axis's borrowed ranks, none)."""
        if self.experts is None:
            return self.size("dp") * self.size("cp")
        return self.experts.edp(self.world_size, self.size("pp"))

    @property
    def expert_sizes(self) -> dict[str, int]:
        """{"etp", "ep", "edp", "pp"}: the experts' grid over the same ranks (ep the axis's, etp 1, with no
        fold)."""
        fold = self.experts or ExpertFold(self.size("ep"))
        return {"etp": fold.etp, "ep": fold.ep, "edp": self.edp, "pp": self.size("pp")}

    @cached_property
    def _sizes(self) -> dict[str, int]:
        """`sizes`, worked out once: a planner's search asks a layout for its sizes many times."""
        return meshes.layout_sizes(self._given(), None)

    @property
    def sizes(self) -> dict[str, int]:
        """The named axes and their sizes, outermost first (`distlab.mesh.AXIS_ORDER`)."""
        return dict(self._sizes)

    @property
    def axes(self) -> tuple[str, ...]:
        """The named axes, outermost first."""
        return tuple(self.sizes)

    def size(self, axis: str) -> int:
        """Ranks along `axis`; 1 for an axis that is not in the layout."""
        return self._sizes.get(axis, 1)

    @property
    def world_size(self) -> int:
        """The number of ranks: the product of the sizes."""
        return math.prod(self._sizes.values())

    def coords(self, rank: int) -> dict[str, int]:
        """Global `rank`'s position along each axis, outermost first (`distlab.mesh.coordinates`)."""
        return meshes.coordinates(rank, **self.sizes)

    def groups(self) -> dict[str, list[list[int]]]:
        """Every axis's groups as lists of global ranks, without processes (`distlab.mesh.layout`)."""
        return meshes.layout(**self.sizes)

    def mesh(self, device_type: str | None = None) -> DeviceMesh:
        """The job's `DeviceMesh` with these axes (`distlab.mesh.grid`); call it on every rank."""
        return meshes.grid(**self.sizes, device_type=device_type)

    def label(self, *axes: str) -> str:
        """"(dp,pp,tp)=(2,2,2)": the sizes of `axes` in the order given (default: the named axes in the
        order of the fields: dp, pp, tp, cp, ep, dp_replicate, dp_shard)."""
        names = axes or tuple(f.name for f in fields(self)
                              if getattr(self, f.name) is not None and f.name != "experts")
        text = f"({','.join(names)})=({','.join(str(self.size(a)) for a in names)})"
        if self.experts is not None and not axes:
            e = self.expert_sizes
            text += f" experts (etp,ep,edp)=({e['etp']},{e['ep']},{e['edp']})"
        return text

    @classmethod
    def of(cls, mesh: DeviceMesh) -> Layout:
        """The layout of a running mesh built by `distlab.mesh.grid` (its axis names and sizes)."""
        names = meshes.mesh_axes(mesh)
        return cls(**{name: mesh.size(i) for i, name in enumerate(names)})
