"""Sharded checkpoints with `torch.distributed.checkpoint` (DCP), reshardable to another mesh.

The contract a trainer offers (`ShardedParam`, the one contract of chapter 9: `model.named_shards` and
`checkpoint.train.Trainer.params` both return it): for each local parameter, its name in the dense GPT,
its local tensor, the dim it is split along over tp (None: replicated), into how many equal chunks that
dim is cut before the split (3 for c_attn's packed [q | k | v], whose tp slice is [q_r | k_r | v_r]: it
is stored as `Shard(1)` of a (3, n_embd, ...) view), and whether it is the last pipeline stage's copy of
the tied embedding (saved once, by stage 0; loaded into both copies). From it every parameter becomes a
DTensor on the (dp, tp) mesh, `Shard(dim)` over tp and `Replicate()` over dp, so DCP knows which slice
of the dense tensor each rank holds: each tp slice is written once (DCP gives every replicated slice to
one rank), and on load each rank reads the slices its new mesh needs, whatever mesh wrote them.

Pipeline stages: with a "pp" dim in the mesh, each rank's DTensors live on its own stage's (dp, tp)
sub-mesh and its state dict holds only its stage's keys. DCP's planner needs no more: each rank plans
its own keys, the coordinator merges the plans (a key on no other rank is simply kept), and the metadata
records, per key, the chunks each rank wrote. A load on another (dp, pp, tp) asks, per rank, for the
chunks of its new stage's keys, wherever they were written
(tests/parallel3d/checkpoint/test_parallel3d_checkpoint_3d.py checks that the chunks of every key
cover it exactly once).

ZeRO's optimizer state is the awkward part. Chapter 7 lays each unit's parameters end to end in one flat
buffer and gives dp-rank i the i-th equal slice; that slice cuts across parameters, and on another mesh
the flat buffer itself is different (it holds other tp slices, other stages' layers). So the state is
saved per parameter, like the parameters themselves (`zero_state`: gathered over dp at save time,
re-flattened into the new layout on load). FSDP2 (torch's per-parameter sharding) avoids the
regrouping by sharding each parameter `Shard(0)` over dp, and so does chapter 7's `ShardedOptimizer`,
whose state dicts go through the same per-parameter keys (`sharded_state`).

`save` writes `<dir>.tmp` and renames it into place once DCP has written `.metadata` and the checksums are
written; an older checkpoint at `<dir>` is renamed aside first and deleted last (`atomic`), so a crash
at any moment leaves a complete checkpoint that `load` and `latest` find. Before the rename, each
rank checksums its share of the data files (`checksums`); `load` checks everything first (`verify`)
and loads nothing from a checkpoint that fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from distlab.mesh import mesh_axes, require_axes
from distlab.parallel3d.checkpoint import atomic, checksums
from distlab.parallel3d.checkpoint.contract import Checkpointable, ShardedParam
from distlab.parallel3d.checkpoint.errors import CheckpointError, from_dcp, from_dcp_save
from distlab.parallel3d.checkpoint.verify import read_metadata, verify


def to_dtensor(p: ShardedParam, mesh: DeviceMesh, tp_dim: str = "tp") -> DTensor:
    """`p.local` as a DTensor on `mesh`: `Shard(p.dim)` along the mesh dim `tp_dim`, `Replicate()` along
    every other dim (Zhao et al. 2023 describe the placements; see torch.distributed.tensor)."""
    names = require_axes(mesh, tp_dim, where=f"to_dtensor(tp_dim={tp_dim!r})",
                         fix=f"build the mesh with distlab.mesh.grid(dp=..., {tp_dim}=...)")
    local, dim = p.stored()
    placements = [Shard(dim) if n == tp_dim and dim is not None else Replicate() for n in names]
    return DTensor.from_local(local, mesh, placements, run_check=False)


def stage_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh this rank's parameters are spread over: `mesh` without its "pp" dim (this rank's pipeline
    stage's (dp, tp) sub-mesh; the other stages hold other keys), or `mesh` itself if it has none."""
    names = mesh_axes(mesh)
    if "pp" not in names:
        return mesh
    rest = tuple(n for n in names if n != "pp")
    if not rest:
        raise ValueError(f"mesh dims {list(names)}: a mesh with only 'pp' has nothing to shard over; build "
                         "it with distlab.mesh.grid(dp=..., pp=..., tp=...)")
    return mesh[rest]


def state_dict(trainer: Checkpointable, mesh: DeviceMesh, saving: bool = True) -> dict:
    """The whole training state as DCP sees it: parameters, Adam's state, the step and the RNG. When
    `saving`, tied copies are left out (stage 0 writes the tied embedding) and the DTensors are views
    of the trainer's tensors; to load, tied copies are in, and every tensor is a fresh copy that DCP
    fills (a load that fails halfway leaves the trainer as it was, at the price of a transient second
    copy of the state)."""
    sub = stage_mesh(mesh)

    def keep(ps: list[ShardedParam]) -> dict[str, DTensor]:
        return {p.name: to_dtensor(p if saving else replace(p, local=p.local.clone()), sub)
                for p in ps if not (saving and p.tied_copy)}

    optim = {key: keep(ps) for key, ps in trainer.optimizer_state().items()}
    return {"model": keep(trainer.params()), "optim": optim,
            "progress": {"step": torch.tensor(trainer.step), "rng": torch.get_rng_state()}}


def save(trainer: Checkpointable, mesh: DeviceMesh, path: str | os.PathLike) -> Path:
    """Write the trainer's sharded state to the directory `path` (a collective: every rank calls it),
    with a CRC-32 of every chunk (`checksums.json`: each rank reads back its share of the data files).
    Atomic across a crash at any point (`atomic`): `path` holds the old checkpoint or the new one."""
    final = _directory(path, saving=True)
    tmp = atomic.tmp_of(final)
    rank, world = dist.get_rank(), dist.get_world_size()
    _on_rank0(lambda: atomic.recover(final), f"repairing {final} before the save", world)
    try:
        dcp.save(state_dict(trainer, mesh), checkpoint_id=str(tmp))
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        raise from_dcp_save(final, e) from e
    if world > 1:
        dist.barrier()
    metadata = read_metadata(tmp)
    names = sorted({info.relative_path for info in (metadata.storage_data or {}).values()})
    part = checksums.compute(tmp, metadata, checksums.share(names, rank, world))
    parts: list[dict] | None = [{} for _ in range(world)] if rank == 0 else None
    if world > 1:
        dist.gather_object(part, parts, dst=0)
    else:
        parts = [part]

    def finish() -> None:
        checksums.write(tmp, parts or [])
        atomic.commit(tmp, final)
    _on_rank0(finish, f"putting {tmp} in place of {final}", world)
    return final


def _on_rank0(fn: Callable[[], None], doing: str, world: int) -> None:
    """Run `fn` (file operations on the shared directory) on rank 0; its OSError, if any, raised as the
    same `CheckpointError` on every rank (the others would otherwise wait at the next collective)."""
    failed = None
    if dist.get_rank() == 0:
        try:
            fn()
        except OSError as e:
            failed = f"{doing} failed ({type(e).__name__}: {e}); the checkpoint saved before is intact"
    failed = _everyone(failed, world)[0]
    if failed is not None:
        raise CheckpointError(failed)


def _directory(path: str | os.PathLike, saving: bool) -> Path:
    """`path` as a checkpoint directory, or a CheckpointError when it (or its parent, to save) is a file."""
    final = Path(path)
    if final.exists() and not final.is_dir():
        fix = ("to save into, e.g. checkpoint.step_dir(root, step)" if saving
               else "a save wrote, e.g. checkpoint.latest(root)")
        raise CheckpointError(f"{final} is a file, not a checkpoint directory: pass the directory {fix}")
    parent = next((p for p in final.parents if p.exists()), None)
    if saving and parent is not None and not parent.is_dir():
        raise CheckpointError(f"cannot save into {final}: {parent} is a file, not a directory; choose a "
                              "path under a directory")
    return final


def load(trainer: Checkpointable, mesh: DeviceMesh, path: str | os.PathLike) -> int:
    """Read the checkpoint at `path` into the trainer, resharding to `mesh`; return the step it was taken
    at. A missing, truncated or damaged file, or another model's checkpoint (a key missing or extra,
    another shape or dtype), raises the same `CheckpointError` on every rank before anything is read
    into the model (`verify.verify`; each rank checksums its share of the files)."""
    path = atomic.resolve(_directory(path, saving=False))  # after a crash mid-save: its .tmp or aside
    sd = state_dict(trainer, mesh, saving=False)
    mine = {f"{group}.{name}": (tuple(t.shape), t.dtype)
            for group in sd for name, t in _flat(sd[group]).items()}
    rank, world = dist.get_rank(), dist.get_world_size()
    expected: dict = {}
    for keys in _everyone(mine, world):  # every stage's keys: the checkpoint must hold these and no more
        expected.update(keys)
    try:
        verify(path, expected, part=(rank, world))
        found = None
    except CheckpointError as e:
        found = str(e)
    problems = [p for p in _everyone(found, world) if p is not None]
    if problems:  # every rank raises the first rank's error: none goes on into dcp.load to wait there
        raise CheckpointError(problems[0])
    try:
        dcp.load(sd, checkpoint_id=str(path))
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        raise from_dcp(path, e) from e
    with torch.no_grad():
        for p in trainer.params():
            p.stored()[0].copy_(sd["model"][p.name].to_local())
    steps = int(sd["progress"]["step"])
    optim = {key: {name: dt.to_local() for name, dt in d.items()} for key, d in sd["optim"].items()}
    trainer.load_optimizer_state(optim, steps)
    torch.set_rng_state(sd["progress"]["rng"])
    trainer.step = steps
    return steps


def _everyone(obj: object, world: int) -> list:
    """`obj` from every rank (all_gather_object over the world, the group DCP itself uses)."""
    if world == 1:
        return [obj]
    out: list = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _flat(d: dict) -> dict[str, Tensor]:
    """{'exp_avg.h.0.ln_1.weight': t, ...} from nested dicts (DCP's own flattening of keys)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update({f"{k}.{k2}": v2 for k2, v2 in _flat(v).items()})
        else:
            out[k] = v
    return out


def latest(root: str | os.PathLike) -> Path | None:
    """The newest checkpoint `root/step_N`, by the integer N (not the name: step_1000000 is newer than
    step_999999), that `load` can read: a finished save, or one a crash left complete in `.tmp` or aside
    (`atomic`); a `.tmp` the save did not finish is skipped."""
    found = atomic.steps(Path(root))
    return found[max(found)] if found else None


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint taken after `step` steps goes."""
    return Path(root) / f"step_{step:06d}"
