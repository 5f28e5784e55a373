"""The checks of lab 9's exercises, each returning a `distlab.checks.CheckResult`.

(a) `check_coordinates(fn)`: `fn(rank, dp, pp, tp)` returns `(coords, peers)`: the rank's position
    {"dp": i, "pp": j, "tp": k} on `distlab.mesh.grid(dp=, pp=, tp=)` (axes laid out pp, dp, tp,
    outermost first, as `AXIS_ORDER` says) and, per axis, the global ranks of its group there, itself
    included, in group order. Checked on several grids against `distlab.mesh.coordinates` and `layout`.
(b) `check_placement(fn)`: `fn(cluster, plan)` returns an order of ("dp", "pp", "tp"), outermost
    first (see `placement.assign`). It must keep every tp group inside one server, and its predicted
    communication time must be within 5% of the best of the six orders (`placement.predict_placement`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import permutations

from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult, is_stub
from distlab.mesh import coordinates, layout
from distlab.parallel3d.config import Plan3D
from distlab.parallel3d.cost_model import AXES
from distlab.parallel3d.placement import EXAMPLE_PLAN, predict_placement
from distlab.topology import Cluster

GRIDS = ((2, 2, 2), (1, 4, 1), (3, 1, 2), (2, 3, 1), (1, 2, 4))


def _peers(rank: int, dp: int, pp: int, tp: int) -> dict[str, list[int]]:
    groups = layout(dp=dp, pp=pp, tp=tp)
    return {d: next(g for g in groups[d] if rank in g) for d in AXES}


def _diagnose_coords(got: object, want: dict[str, int], rank: int, sizes: dict[str, int]) -> list[str]:
    if not isinstance(got, dict) or set(got) != set(AXES):
        return [f"coords for rank {rank} should be a dict with keys dp, pp, tp; got {got!r}"]
    if got == want:
        return []
    flipped = coordinates(rank, tp=sizes["tp"], dp=sizes["dp"], pp=sizes["pp"])
    hint = ""
    if got == {"dp": rank // (sizes["pp"] * sizes["tp"]) % sizes["dp"],
               "pp": rank // sizes["tp"] % sizes["pp"], "tp": rank % sizes["tp"]}:
        hint = ("; you laid the axes out as dp, pp, tp (dp outermost): the mesh puts pp outermost, then "
                "dp, then tp (AXIS_ORDER)")
    elif got == flipped:
        hint = "; the digits are read in the wrong order: tp is the innermost (fastest-changing) axis"
    return [f"rank {rank} on dp={sizes['dp']}, pp={sizes['pp']}, tp={sizes['tp']}: coords {got}, "
            f"expected {want}{hint}"]


def check_coordinates(fn: Callable[[int, int, int, int], tuple[dict[str, int], dict[str, list[int]]]],
                      grids: Sequence[tuple[int, int, int]] = GRIDS) -> CheckResult:
    """Exercise (a): coordinates and peers of every rank on several (dp, pp, tp) `grids` (see the module
    docstring)."""
    cases = []
    for dp, pp, tp in grids:
        sizes = {"dp": dp, "pp": pp, "tp": tp}
        lines: list[str] = []
        for rank in range(dp * pp * tp):
            try:
                coords, peers = fn(rank, dp, pp, tp)
            except Exception as e:  # the student's error, reported as a finding
                lines.append(NOT_WRITTEN if is_stub(e) else f"fn({rank}, {dp}, {pp}, {tp}) raised "
                             f"{type(e).__name__}: {e}")
                break
            lines += _diagnose_coords(coords, coordinates(rank, pp=pp, dp=dp, tp=tp), rank, sizes)
            want = _peers(rank, dp, pp, tp)
            for d in AXES:
                got = list(peers.get(d, [])) if isinstance(peers, dict) else None
                if got == want[d]:
                    continue
                extra = ""
                if got is not None and sorted(got) == sorted(set(want[d]) - {rank}):
                    extra = "; include the rank itself: a group is every rank that differs only in that axis"
                elif got == list(range(len(want[d]))):
                    extra = "; these are positions in the group; give global ranks (dist.get_global_rank)"
                lines.append(f"rank {rank}: {d} peers {got}, expected {want[d]}{extra}")
            if len(lines) >= 3:
                break
        cases.append(CaseResult(f"dp={dp}, pp={pp}, tp={tp}", not lines, lines[:3]))
    return CheckResult("exercise (a): coordinates and peers on the mesh", cases, case_heading="grid")


PLACEMENT_CASES = (("DGX A100", 2, EXAMPLE_PLAN),
                   ("DGX H100", 2, Plan3D(dp=4, pp=2, tp=2, m=8, zero_stage=1)),
                   ("DGX A100", 4, Plan3D(dp=2, pp=4, tp=4, m=8, zero_stage=1)))


def check_placement(fn: Callable[[Cluster, Plan3D], tuple[str, ...]],
                    settings: Sequence[tuple[str, int, Plan3D]] = PLACEMENT_CASES) -> CheckResult:
    """Exercise (b): per cluster and plan (`settings`: server, nodes, plan), an axis order that keeps tp in a
    server and is (nearly) fastest."""
    cases = []
    for server, nodes, plan in settings:
        cluster = Cluster(server, nodes)
        label = f"{nodes} x {server}, {plan.label()}"
        try:
            order = tuple(fn(cluster, plan))
            mine = predict_placement("yours", order, cluster, plan=plan)
        except Exception as e:  # the student's error, or a malformed order, reported as a finding
            found = NOT_WRITTEN if is_stub(e) else f"{type(e).__name__}: {e}"
            cases.append(CaseResult(label, False, [found]))
            continue
        costs = {o: predict_placement("", o, cluster, plan=plan).seconds for o in permutations(AXES)}
        best = min(costs, key=costs.get)
        lines = []
        if mine.axes["tp"].crosses_servers:
            lines.append(f"order {order} splits tp groups over servers: tp's all-reduces then run at "
                         f"{mine.axes['tp'].GBps:.0f} GB/s instead of NVLink's; put tp last (innermost)")
        if mine.seconds > 1.05 * costs[best]:
            lines.append(f"predicted {1e3 * mine.seconds:.1f} ms of communication per step; {best} gives "
                         f"{1e3 * costs[best]:.1f} ms: let the axis with the fewest bytes cross the network")
        cases.append(CaseResult(label, not lines, lines))
    return CheckResult("exercise (b): placing the mesh on servers", cases, case_heading="cluster and plan")
