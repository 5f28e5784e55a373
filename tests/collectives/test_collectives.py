"""Parity of distlab.collectives with torch.distributed's built-ins, on real ranks (gloo).

Every rank loops over many cases inside ONE launch per world size (a launch costs seconds) and returns
a list of failures; the test asserts the list is empty and prints it otherwise.

Tolerance: inputs are integer-valued (small integers, also for float32/float64), so every sum,
product, min and max is exact whatever the order of reduction; all comparisons are therefore exact
(torch.equal), for floats as for int64.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from distlab import launch, mesh
from distlab.collectives import (
    ALGORITHMS,
    Segmenting,
    chunk_bounds,
    gather,
    hierarchical_all_reduce,
    pairwise_all_to_all,
    recursive_doubling_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_all_reduce_schedule,
    ring_reduce_scatter,
    scatter,
    segmented_ring_all_reduce,
    tree_broadcast,
    tree_reduce,
)

ALL_REDUCES = [("ring_all_reduce", ring_all_reduce), ("segmented_ring_all_reduce", segmented_ring_all_reduce),
               ("recursive_doubling_all_reduce", recursive_doubling_all_reduce)]

WORLD_SIZES = [1, 2, 3, 4, 5, 8]
SIZES = [1, 7, 1000, 1001]  # world sizes above 4 use SIZES_LARGE_WORLD: 8 ranks on 2 cores are slow
SIZES_LARGE_WORLD = [1, 1001]
DTYPES = [torch.float32, torch.float64, torch.int64]
OPS = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
OP_NAMES = {ReduceOp.SUM: "SUM", ReduceOp.PRODUCT: "PRODUCT", ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX"}


def _data(n: int, dtype: torch.dtype, op: ReduceOp, seed: int) -> torch.Tensor:
    """Small integers (in [-2, 2] without 0 for PRODUCT, so that 8 ranks cannot overflow)."""
    g = torch.Generator().manual_seed(seed)
    if op == ReduceOp.PRODUCT:
        values = torch.tensor([-2, -1, 1, 2])[torch.randint(0, 4, (n,), generator=g)]
    else:
        values = torch.randint(-50, 50, (n,), generator=g)
    return values.to(dtype)


def _check(failures: list[str], what: str, got: object, want: torch.Tensor) -> None:
    """Record a failure unless `got` equals `want` exactly (dtype, shape and every element)."""
    if not isinstance(got, torch.Tensor):
        failures.append(f"rank {dist.get_rank()}: {what}: got {got!r}, want a tensor")
    elif got.dtype != want.dtype or got.shape != want.shape:
        failures.append(f"rank {dist.get_rank()}: {what}: got {tuple(got.shape)} {got.dtype}, "
                        f"want {tuple(want.shape)} {want.dtype}")
    elif not torch.equal(got, want):
        wrong = (got != want).flatten().nonzero().flatten()
        i = int(wrong[0])
        g, w = got.flatten()[i].item(), want.flatten()[i].item()
        failures.append(f"rank {dist.get_rank()}: {what}: {len(wrong)} of {want.numel()} elements differ, "
                        f"first at flat index {i}: got {g}, want {w}")


def _reductions(failures: list[str], n: int, dtype: torch.dtype, op: ReduceOp) -> None:
    r, p = dist.get_rank(), dist.get_world_size()
    case = f"n={n} {dtype} {OP_NAMES[op]}"
    x = _data(n, dtype, op, seed=1000 * r + n)
    want = x.clone()
    dist.all_reduce(want, op=op)
    for name, fn in ALL_REDUCES:
        y = x.clone()
        out = fn(y, op=op)
        _check(failures, f"{name} {case}", y, want)
        if out is not y:
            failures.append(f"{name} {case}: did not return the tensor it reduced in place")
    for k in sorted({1, 2, 3, p}):
        y = x.clone()
        hierarchical_all_reduce(y, k, op=op)
        _check(failures, f"hierarchical_all_reduce ranks_per_node={k} {case}", y, want)
    lo, hi = chunk_bounds(n, p)[r]
    _check(failures, f"ring_reduce_scatter {case}", ring_reduce_scatter(x, op=op), want[lo:hi])
    out = torch.empty(hi - lo, dtype=dtype)
    if ring_reduce_scatter(x, op=op, out=out) is not out:
        failures.append(f"rank {r}: ring_reduce_scatter {case}: did not return the out= tensor")
    _check(failures, f"ring_reduce_scatter out= {case}", out, want[lo:hi])
    _check(failures, f"ring_reduce_scatter left its input alone {case}", x,
           _data(n, dtype, op, seed=1000 * r + n))
    for dst in sorted({0, p - 1}):
        y, ref = x.clone(), x.clone()
        dist.reduce(ref, dst=dst, op=op)
        tree_reduce(y, dst=dst, op=op)
        _check(failures, f"tree_reduce dst={dst} {case}", y, ref if r == dst else x)


def _data_movement(failures: list[str], n: int, dtype: torch.dtype) -> None:
    r, p = dist.get_rank(), dist.get_world_size()
    case = f"n={n} {dtype}"
    x = _data(n, dtype, ReduceOp.SUM, seed=7 * r + n)
    everyone = [torch.empty_like(x) for _ in range(p)]
    dist.all_gather(everyone, x)
    _check(failures, f"ring_all_gather {case}", ring_all_gather(x), torch.cat(everyone))
    out = torch.empty(p, n, dtype=dtype)
    _check(failures, f"ring_all_gather out= {case}", ring_all_gather(x, out=out), torch.cat(everyone))
    _check(failures, f"ring_all_gather wrote out= {case}", out, torch.stack(everyone))
    for root in sorted({0, p // 2, p - 1}):
        y, ref = x.clone(), x.clone()
        dist.broadcast(ref, src=root)
        tree_broadcast(y, src=root)
        _check(failures, f"tree_broadcast src={root} {case}", y, ref)
        chunks = [_data(n, dtype, ReduceOp.SUM, seed=j + 100 * root) for j in range(p)]
        ref = torch.empty_like(x)
        dist.scatter(ref, chunks if r == root else None, src=root)
        _check(failures, f"scatter src={root} {case}", scatter(chunks if r == root else None, src=root), ref)
        got = gather(x, dst=root)
        if r == root:
            ref_list = [torch.empty_like(x) for _ in range(p)]
            dist.gather(x, ref_list, dst=root)
            _check(failures, f"gather dst={root} {case}", torch.stack(got) if got else got,
                   torch.stack(ref_list))
        else:
            dist.gather(x, None, dst=root)
            if got is not None:
                failures.append(f"rank {r}: gather dst={root} {case} returned {type(got)} instead of None")
    # all-to-all with uneven split sizes: rank r sends (r + 2 j + n) % 5 rows of width 3 to rank j
    rows = [(r + 2 * j + n) % 5 for j in range(p)]
    ins = [_data(rows[j] * 3, dtype, ReduceOp.SUM, seed=31 * r + j).view(rows[j], 3) for j in range(p)]
    incoming = [(j + 2 * r + n) % 5 for j in range(p)]
    ref = torch.empty(sum(incoming), 3, dtype=dtype)
    dist.all_to_all_single(ref, torch.cat(ins), incoming, rows)
    want = list(torch.split(ref, incoming))
    for sizes in (None, incoming):
        got = pairwise_all_to_all(ins, output_split_sizes=sizes)
        for j in range(p):
            _check(failures, f"pairwise_all_to_all output_split_sizes={sizes} from {j} {case}", got[j],
                   want[j])


def _shapes(failures: list[str]) -> None:
    """Multi-dimensional and non-contiguous tensors."""
    r, p = dist.get_rank(), dist.get_world_size()
    x = _data(60, torch.float64, ReduceOp.SUM, seed=r).view(3, 4, 5)
    want = x.clone()
    dist.all_reduce(want)
    for name, fn in [*ALL_REDUCES, ("hierarchical", lambda t: hierarchical_all_reduce(t, 2))]:
        y = x.clone()
        fn(y)
        _check(failures, f"{name} 3-d", y, want)
        y = x.clone().transpose(0, 2)  # non-contiguous: reduced through a copy, written back in place
        fn(y)
        _check(failures, f"{name} non-contiguous", y, want.transpose(0, 2))
    y = x.clone().transpose(0, 2)
    tree_broadcast(y, src=p - 1)
    ref = x.clone()
    dist.broadcast(ref, src=p - 1)
    _check(failures, "tree_broadcast non-contiguous", y, ref.transpose(0, 2))
    everyone = [torch.empty_like(x) for _ in range(p)]
    dist.all_gather(everyone, x)
    _check(failures, "ring_all_gather 3-d", ring_all_gather(x), torch.cat(everyone))
    _check(failures, "ring_all_gather 0-d", ring_all_gather(torch.tensor(float(r))),
           torch.arange(p, dtype=torch.float32))


def _odd_ranks(failures: list[str]) -> None:
    """A group of the odd ranks (rank 0 alone when there are none), in the middle of other traffic:
    roots and chunk owners are group ranks."""
    r, p = dist.get_rank(), dist.get_world_size()
    members = [q for q in range(p) if q % 2] or [0]
    g = dist.new_group(members)  # every rank calls new_group, members or not
    x = _data(60, torch.float64, ReduceOp.SUM, seed=r)
    everyone = [torch.empty_like(x) for _ in range(p)]
    dist.all_gather(everyone, x)
    if r not in members:
        return
    i, last = members.index(r), len(members) - 1
    want = torch.stack([everyone[q] for q in members]).sum(0)
    two_level = ("hierarchical", lambda t, group: hierarchical_all_reduce(t, 2, group=group))
    for name, fn in [*ALL_REDUCES, two_level]:
        y = x.clone()
        fn(y, group=g)
        _check(failures, f"{name} on ranks {members}", y, want)
    got = gather(x, dst=last, group=g)
    if i == last:
        _check(failures, f"gather on ranks {members}", torch.stack(got),
               torch.stack([everyone[q] for q in members]))
    y = x.clone()
    tree_reduce(y, dst=0, group=g)
    _check(failures, f"tree_reduce on ranks {members}", y, want if i == 0 else x)
    chunks = [everyone[q] * 2 for q in members] if i == 0 else None
    _check(failures, f"scatter on ranks {members}", scatter(chunks, src=0, group=g), x * 2)
    lo, hi = chunk_bounds(60, len(members))[i]
    _check(failures, f"ring_reduce_scatter on ranks {members}", ring_reduce_scatter(x, group=g),
           want.flatten()[lo:hi])


def _pipelined(failures: list[str]) -> None:
    """Tiny segments, so that the segment pipelines (many segments per chunk) run on small inputs."""
    r, p = dist.get_rank(), dist.get_world_size()
    for seg, depth in ((256, 4), (200, 1), (1024, 2)):
        cut = Segmenting(segment_bytes=seg, pipeline_depth=depth, min_segment_bytes=16)
        for n in (7, 1001, 3000):
            x = _data(n, torch.float64, ReduceOp.SUM, seed=r + n)
            want = x.clone()
            dist.all_reduce(want)
            for name, fn in ALL_REDUCES[1:] + [("hierarchical", lambda t, segmenting: hierarchical_all_reduce(
                    t, 2, segmenting=segmenting))]:
                y = x.clone()
                fn(y, segmenting=cut)
                _check(failures, f"{name} segments of {seg} B, depth {depth}, n={n}", y, want)
            lo, hi = chunk_bounds(n, p)[r]
            _check(failures, f"ring_reduce_scatter segments of {seg} B, n={n}",
                   ring_reduce_scatter(x, segmenting=cut), want[lo:hi])
            y = x.clone()
            tree_reduce(y, dst=0, segmenting=cut)
            _check(failures, f"tree_reduce segments of {seg} B, n={n}", y, want if r == 0 else x)
            y = x.clone()
            tree_broadcast(y, src=p - 1, segmenting=cut)
            ref = x.clone()
            dist.broadcast(ref, src=p - 1)
            _check(failures, f"tree_broadcast segments of {seg} B, n={n}", y, ref)
            everyone = [torch.empty_like(x) for _ in range(p)]
            dist.all_gather(everyone, x)
            _check(failures, f"ring_all_gather segments of {seg} B, n={n}",
                   ring_all_gather(x, segmenting=cut), torch.cat(everyone))


def _rank_checks(sizes: list[int]) -> list[str]:
    failures: list[str] = []
    for dtype in DTYPES:
        for n in sizes:
            for op in OPS:
                _reductions(failures, n, dtype, op)
            _data_movement(failures, n, dtype)
    _shapes(failures)
    _odd_ranks(failures)
    _pipelined(failures)
    empty = torch.empty(0)
    _check(failures, "ring_all_reduce of an empty tensor", ring_all_reduce(empty), empty)
    return failures


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_parity_with_torch_distributed(world_size: int) -> None:
    sizes = SIZES if world_size <= 4 else SIZES_LARGE_WORLD
    results = launch.run(_rank_checks, world_size, sizes, backend="gloo", timeout=60)
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, f"{len(failures)} mismatches, first ones:\n" + "\n".join(failures[:20])


# --------------------------------------------------------------------------------------------------
# On one dim of a mesh: the same results as on a world of that size
# --------------------------------------------------------------------------------------------------

def _every_algorithm(group: dist.ProcessGroup | None) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Every algorithm on `group`, on inputs that depend only on the group rank: the results by name,
    and every difference from torch.distributed's collective on the same group."""
    i, p = dist.get_rank(group), dist.get_world_size(group)
    failures: list[str] = []
    n = 1001
    x = _data(n, torch.float64, ReduceOp.SUM, seed=7 * i + 1)
    want = x.clone()
    dist.all_reduce(want, group=group)
    small = Segmenting(segment_bytes=512, pipeline_depth=2, min_segment_bytes=64)
    out = {name: fn(x.clone(), group=group) for name, fn in ALL_REDUCES}
    out["segmented_ring_all_reduce small segments"] = segmented_ring_all_reduce(x.clone(), group=group,
                                                                                segmenting=small)
    for k in (1, 2):
        out[f"hierarchical_all_reduce {k}/node"] = hierarchical_all_reduce(x.clone(), k, group=group)
    for name in list(out):
        _check(failures, name, out[name], want)
    lo, hi = chunk_bounds(n, p)[i]
    out["ring_reduce_scatter"] = ring_reduce_scatter(x, group=group, segmenting=small)
    _check(failures, "ring_reduce_scatter", out["ring_reduce_scatter"], want[lo:hi])
    everyone = [torch.empty_like(x) for _ in range(p)]
    dist.all_gather(everyone, x, group=group)
    out["ring_all_gather"] = ring_all_gather(x, group=group)
    _check(failures, "ring_all_gather", out["ring_all_gather"], torch.cat(everyone))
    for root in sorted({0, p - 1}):
        _rooted(failures, out, x, root, group)
    rows = [(i + 2 * j) % 4 + 1 for j in range(p)]
    ins = [_data(rows[j] * 3, torch.float64, ReduceOp.SUM, seed=31 * i + j).view(rows[j], 3)
           for j in range(p)]
    incoming = [(j + 2 * i) % 4 + 1 for j in range(p)]
    ref = torch.empty(sum(incoming), 3, dtype=torch.float64)
    dist.all_to_all_single(ref, torch.cat(ins), incoming, rows, group=group)
    out["pairwise_all_to_all"] = torch.cat(pairwise_all_to_all(ins, group=group))
    _check(failures, "pairwise_all_to_all", out["pairwise_all_to_all"], ref)
    return out, failures


def _rooted(failures: list[str], out: dict[str, torch.Tensor], x: torch.Tensor, root: int,
            group: dist.ProcessGroup | None) -> None:
    """Broadcast, reduce, scatter and gather from group rank `root`, against the built-ins."""
    i, p = dist.get_rank(group), dist.get_world_size(group)
    y, ref = x.clone(), x.clone()
    out[f"tree_broadcast src={root}"] = tree_broadcast(y, src=root, group=group)
    dist.broadcast(ref, group=group, group_src=root)
    _check(failures, f"tree_broadcast src={root}", y, ref)
    y, ref = x.clone(), x.clone()
    out[f"tree_reduce dst={root}"] = tree_reduce(y, dst=root, group=group)
    dist.reduce(ref, group=group, group_dst=root)
    _check(failures, f"tree_reduce dst={root}", y, ref if i == root else x)
    chunks = [_data(x.numel(), x.dtype, ReduceOp.SUM, seed=100 + j) for j in range(p)]
    ref = torch.empty_like(x)
    dist.scatter(ref, chunks if i == root else None, group=group, group_src=root)
    out[f"scatter src={root}"] = scatter(chunks if i == root else None, src=root, group=group)
    _check(failures, f"scatter src={root}", out[f"scatter src={root}"], ref)
    got = gather(x, dst=root, group=group)
    refs = [torch.empty_like(x) for _ in range(p)] if i == root else None
    dist.gather(x, refs, group=group, group_dst=root)
    out[f"gather dst={root}"] = torch.stack(got) if got is not None else torch.empty(0)
    if i == root:
        _check(failures, f"gather dst={root}", out[f"gather dst={root}"], torch.stack(refs))
    elif got is not None:
        failures.append(f"gather dst={root}: group rank {i} got a list instead of None")


def _on_mesh_dims() -> dict[str, tuple[dict[str, torch.Tensor], list[str]]]:
    grid = mesh.grid(dp=2, tp=2)
    return {dim: _every_algorithm(grid[dim].get_group()) for dim in ("tp", "dp")}


def test_every_algorithm_on_a_mesh_dim_equals_the_built_in_and_the_whole_world_run() -> None:
    """On 4 ranks as grid(dp=2, tp=2), every algorithm on each "tp" and each "dp" group gives what
    torch.distributed gives on that group, and exactly what it gives on a world of 2 ranks."""
    on_mesh = launch.run(_on_mesh_dims, 4, backend="gloo", timeout=120)
    whole = launch.run(_every_algorithm, 2, None, backend="gloo", timeout=120)
    for r in range(4):
        for dim, i in (("tp", r % 2), ("dp", r // 2)):  # this rank's place in its group of `dim`
            results, failures = on_mesh[r][dim]
            assert not failures, f"rank {r}, {dim} group: " + "\n".join(failures[:10])
            assert not whole[i][1], "\n".join(whole[i][1][:10])
            assert results.keys() == whole[i][0].keys()
            for name, got in results.items():
                assert torch.equal(got, whole[i][0][name]), f"rank {r}, {dim} group rank {i}: {name}"


# --------------------------------------------------------------------------------------------------
# Bad input: each error is raised before any message is sent, so every rank can check it locally
# --------------------------------------------------------------------------------------------------

def _bad_inputs() -> dict[str, str]:
    r, p = dist.get_rank(), dist.get_world_size()
    alone = dist.new_group([0])  # rank 0's own group; on rank 1, GroupMember.NON_GROUP_MEMBER
    other = dist.new_group([1])  # (every rank creates every group, in the same order)
    t = torch.ones(4)
    cases = {
        "caller not in the group": lambda: ring_all_gather(t, group=alone if r == 1 else other),
        "group not a ProcessGroup": lambda: ring_all_reduce(t, group=[0, 1]),
        "src outside the group": lambda: tree_broadcast(t, src=p + 5),
        "src not an integer": lambda: scatter([t, t], src="0"),
        "dst outside a sub-group": lambda: tree_reduce(t, dst=1, group=alone) if r == 0 else gather(
            t, dst=-1),
        "ranks_per_node < 1": lambda: hierarchical_all_reduce(t, 0),
        "unsupported op": lambda: ring_all_reduce(t, op=ReduceOp.AVG),
        "op not a ReduceOp": lambda: tree_reduce(t, op="sum"),
        "segmenting not a Segmenting": lambda: segmented_ring_all_reduce(t, segmenting=1 << 20),
        "wrong number of scatter chunks": lambda: scatter([t, t, t], src=r),
        "scatter chunks of different shapes": lambda: scatter([t, torch.ones(5)], src=r),
        "all_to_all inputs of wrong length": lambda: pairwise_all_to_all([t] * (p + 1)),
        "all_to_all mixed trailing dims": lambda: pairwise_all_to_all([torch.ones(2, 3), torch.ones(2, 4)]),
        "all_to_all bad output_split_sizes": lambda: pairwise_all_to_all([t] * p, output_split_sizes=[1] * p),
        "not a tensor": lambda: ring_all_reduce([1.0, 2.0]),
        "all_gather out of wrong size": lambda: ring_all_gather(t, out=torch.empty(4)),
        "reduce_scatter out of wrong dtype": lambda: ring_reduce_scatter(
            t, out=torch.empty(2, dtype=torch.int64)),
    }
    messages = {}
    for name, call in cases.items():
        try:
            call()
            messages[name] = "no error"
        except ValueError as e:
            messages[name] = str(e)
        except Exception as e:  # reported as a failure below
            messages[name] = f"{type(e).__name__}: {e}"
    return messages


EXPECTED_MESSAGES = {
    "caller not in the group": ["rank {r} called a collective on a group it is not a member of",
                                "mesh['tp'].get_group()"],
    "group not a ProcessGroup": ["group=[0, 1] must be a torch.distributed ProcessGroup", "or None"],
    "src outside the group": ["src=7 is not a rank of the group of 2 rank(s)", "not a global rank"],
    "src not an integer": ["src='0' is not a rank of the group of 2 rank(s)"],
    "dst outside a sub-group": ["is not a rank of the group of", "(0 .. "],
    "ranks_per_node < 1": ["ranks_per_node=0 must be an integer >= 1"],
    "unsupported op": ["is not supported; use ReduceOp.SUM"],
    "op not a ReduceOp": ["op='sum' is not supported"],
    "segmenting not a Segmenting": ["segmenting=1048576 must be a Segmenting"],
    "wrong number of scatter chunks": ["must be a list of 2 tensors, one per rank of the group",
                                       "got 3 chunks"],
    "scatter chunks of different shapes": ["one shape and dtype"],
    "all_to_all inputs of wrong length": ["inputs must be a list of 2 tensors", "got 3 items"],
    "all_to_all mixed trailing dims": ["every dimension but the first"],
    "all_to_all bad output_split_sizes": ["output_split_sizes=[1, 1] must list 2 non-negative ints"],
    "not a tensor": ["tensor must be a torch.Tensor, got list"],
    "all_gather out of wrong size": ["out must be a contiguous tensor of 8 elements", "got (4,)"],
    "reduce_scatter out of wrong dtype": ["out must be a contiguous tensor of 2 elements", "torch.int64"],
}


def test_bad_inputs_raise_clear_errors() -> None:
    results = launch.run(_bad_inputs, 2, backend="gloo", timeout=60)
    for r, messages in enumerate(results):
        for name, fragments in EXPECTED_MESSAGES.items():
            for fragment in fragments:
                assert fragment.format(r=r) in messages[name], f"rank {r}, {name}: {messages[name]!r}"


def test_outside_a_process_group() -> None:
    with pytest.raises(RuntimeError, match="no process group is initialised"):
        ring_all_reduce(torch.ones(2))


def test_segmenting_is_checked() -> None:
    with pytest.raises(ValueError, match=r"Segmenting.segment_bytes=0 must be a positive integer, e\.g\. "
                                         r"Segmenting\(segment_bytes=1048576\)"):
        Segmenting(segment_bytes=0)
    with pytest.raises(ValueError, match="Segmenting.pipeline_depth=True must be a positive integer"):
        Segmenting(pipeline_depth=True)


# --------------------------------------------------------------------------------------------------
# Pure functions: chunk_bounds, the ring schedule, the registry
# --------------------------------------------------------------------------------------------------

def test_chunk_bounds() -> None:
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert chunk_bounds(0, 3) == [(0, 0)] * 3
    for numel in range(0, 30):
        for parts in range(1, 9):
            b = chunk_bounds(numel, parts)
            assert b[0][0] == 0 and b[-1][1] == numel
            assert all(b[i][1] == b[i + 1][0] for i in range(parts - 1))
            assert max(hi - lo for lo, hi in b) - min(hi - lo for lo, hi in b) <= 1
    with pytest.raises(ValueError, match="parts=0 must be a positive integer"):
        chunk_bounds(4, 0)
    with pytest.raises(ValueError, match="numel=-1 must be a non-negative integer"):
        chunk_bounds(-1, 2)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_ring_schedule_moves_every_chunk(p: int) -> None:
    """Simulate the schedule: which ranks' contributions each rank holds for each chunk."""
    schedule = ring_all_reduce_schedule(p)
    assert len(schedule) == 2 * (p - 1) and all(len(row) == p for row in schedule)
    held = [[{r} for _ in range(p)] for r in range(p)]  # held[rank][chunk] = contributing ranks
    for step in schedule:
        assert {s.phase for s in step} <= {"reduce-scatter", "all-gather"}
        new = [[set(c) for c in row] for row in held]
        for r, s in enumerate(step):
            assert s.send_to == (r + 1) % p and s.recv_from == (r - 1) % p
            sender = step[s.recv_from]
            assert sender.send_chunk == s.recv_chunk, "a rank must receive the chunk its neighbour sends"
            incoming = held[s.recv_from][s.recv_chunk]
            if s.phase == "reduce-scatter":
                new[r][s.recv_chunk] = held[r][s.recv_chunk] | incoming
            else:
                new[r][s.recv_chunk] = set(incoming)
        held = new
        if step[0].phase == "reduce-scatter" and step is schedule[p - 2]:
            for r in range(p):  # after the reduce-scatter, rank r owns the full reduction of chunk r
                assert held[r][r] == set(range(p))
    assert all(c == set(range(p)) for row in held for c in row)
    with pytest.raises(ValueError, match="p=0 must be a positive integer"):
        ring_all_reduce_schedule(0)


def test_registry() -> None:
    collectives = {a.collective for a in ALGORITHMS.values()}
    assert collectives == {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "scatter",
                           "gather", "all_to_all"}
    assert {n for n, a in ALGORITHMS.items() if a.collective == "all_reduce"} == {
        "ring_all_reduce", "segmented_ring_all_reduce", "recursive_doubling_all_reduce",
        "hierarchical_all_reduce"}
    assert ALGORITHMS["hierarchical_all_reduce"].needs == ("ranks_per_node",)
    assert all(callable(a.fn) and a.description for a in ALGORITHMS.values())
