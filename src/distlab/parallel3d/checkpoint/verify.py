"""Check a DCP checkpoint directory before loading it, so that a damaged one fails loudly and by name.

DCP writes one or more data files per rank (`__0_0.distcp`, ...) and, last, `.metadata`: for every key
the global shape, and for every chunk the file, byte offset and length it lives at. `verify` reads that
map and checks it against the files and against the model about to be loaded:

- `.metadata` missing or unreadable: the save never finished (or this is not a checkpoint);
- a data file missing, or shorter than the last byte a chunk needs (a truncated copy);
- a key the model needs that is absent, a key the model does not have (a deeper or wider model's
  checkpoint), or a global shape or dtype that differs (another model's checkpoint);
- `.metadata` or a chunk of a data file whose bytes differ from what the save wrote (`checksums`: a
  CRC-32 of every chunk, which DCP itself does not keep).

Each error is a `CheckpointError` naming the directory, the file and the keys concerned, raised before
anything is read into the model. The checks are ordered cheapest first; the checksums read every byte.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from distlab.parallel3d.checkpoint import checksums
from distlab.parallel3d.checkpoint.errors import CheckpointError

__all__ = ["CheckpointError", "check_files", "check_keys", "read_metadata", "verify"]


def read_metadata(path: str | os.PathLike) -> Metadata:
    """DCP's `.metadata` of the checkpoint directory `path`, or a CheckpointError saying what is wrong."""
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"{root} is a file, not a checkpoint directory; pass a directory written by "
                              "distlab.parallel3d.checkpoint.save (e.g. checkpoint.latest(root))")
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist; pass a directory written by "
                              "distlab.parallel3d.checkpoint.save (e.g. checkpoint.latest(root))")
    meta = root / ".metadata"
    if not meta.is_file():
        raise CheckpointError(f"{meta} is missing: the save into {root} did not finish (DCP writes "
                              ".metadata last); load an earlier checkpoint instead")
    try:
        return FileSystemReader(str(root)).read_metadata()
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        raise CheckpointError(f"{meta} cannot be read ({type(e).__name__}: {e}); the file is damaged, "
                              "load an earlier checkpoint instead") from e


def check_files(path: str | os.PathLike, metadata: Metadata, written: dict[str, dict] | None = None) -> None:
    """Every data file the metadata names exists, has the size the save wrote (`written`, the files'
    table of `checksums.json`; None: not checked) and is long enough for every chunk stored in it."""
    root = Path(path)
    need: dict[str, int] = defaultdict(int)
    keys: dict[str, list[str]] = defaultdict(list)
    for index, info in (metadata.storage_data or {}).items():
        need[info.relative_path] = max(need[info.relative_path], info.offset + info.length)
        keys[info.relative_path].append(index.fqn)
    for name in sorted(need):
        file = root / name
        shown = ", ".join(sorted(set(keys[name]))[:3]) + (", ..." if len(set(keys[name])) > 3 else "")
        if not file.is_file():
            raise CheckpointError(f"shard file {file} is missing; it holds {len(set(keys[name]))} keys "
                                  f"({shown}); the checkpoint is incomplete, load an earlier one")
        size = file.stat().st_size
        _check_size(file, size, written or {})
        if size < need[name]:
            raise CheckpointError(f"shard file {file} is truncated: {size} bytes, but its chunks need "
                                  f"{need[name]} (keys {shown}); load an earlier checkpoint")


def _check_size(file: Path, size: int, written: dict[str, dict]) -> None:
    """A data file whose size is not the one the save wrote: another file of this checkpoint (swapped),
    a file from elsewhere (mismatched), or a copy cut short (truncated)."""
    want = written.get(file.name, {}).get("size")
    if want is None or size == want:
        return
    others = sorted(n for n, entry in written.items() if n != file.name and entry.get("size") == size)
    if others:
        raise CheckpointError(f"shard file {file} has {size} bytes, but the save wrote {want}; {size} is "
                              f"the size of {others[0]}: the files were swapped or mismatched (renamed or "
                              "copied in from elsewhere); restore them, or load an earlier checkpoint")
    if size < want:
        raise CheckpointError(f"shard file {file} is truncated: {size} bytes, but the save wrote {want}; "
                              "load an earlier checkpoint")
    raise CheckpointError(f"shard file {file} has {size} bytes, but the save wrote {want}: it was replaced "
                          "by another file (mismatched) or appended to; load an earlier checkpoint")


def _listed(keys: list[str]) -> str:
    return ", ".join(repr(k) for k in keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def check_keys(path: str | os.PathLike, metadata: Metadata,
               expected: dict[str, tuple[int, ...] | tuple[tuple[int, ...], torch.dtype]]) -> None:
    """The checkpoint's keys are exactly those of `expected` ({key: global shape} or {key: (shape,
    dtype)}, every key of the model being loaded, all pipeline stages together), with those shapes and
    dtypes: a key missing, a key the model does not have, or another shape or dtype is refused by name."""
    stored = metadata.state_dict_metadata
    missing = sorted(k for k in expected if k not in stored)
    if missing:
        raise CheckpointError(f"key {missing[0]!r} is missing from the checkpoint {path} (it has "
                              f"{len(stored)} keys, the model needs {len(expected)}; missing: "
                              f"{_listed(missing)}); it was written by a different model")
    extra = sorted(k for k in stored if k not in expected)
    if extra:
        raise CheckpointError(f"the checkpoint {path} has {len(extra)} key(s) the model does not have "
                              f"({_listed(extra)}); it was written by a different (larger) model, and "
                              "loading only the keys this model has would train something else: build the "
                              "model with the checkpoint's configuration")
    for key, want in expected.items():
        md = stored[key]
        if isinstance(md, TensorStorageMetadata):
            _check_tensor(path, key, md, want)


def _check_tensor(path: str | os.PathLike, key: str, md: TensorStorageMetadata,
                  want: tuple[int, ...] | tuple[tuple[int, ...], torch.dtype]) -> None:
    """Tensor `key`'s stored shape (and dtype, where `want` gives one) against the model's."""
    shape, dtype = want if len(want) == 2 and isinstance(want[1], torch.dtype) else (want, None)
    if tuple(md.size) != tuple(shape):
        raise CheckpointError(f"key {key!r} has shape {tuple(md.size)} in the checkpoint {path}, but "
                              f"the model needs {tuple(shape)}; it was written by a model of another "
                              "shape: build the model with the checkpoint's configuration")
    if dtype is not None and md.properties.dtype != dtype:
        raise CheckpointError(f"key {key!r} is {md.properties.dtype} in the checkpoint {path}, but the "
                              f"model holds {dtype}; loading would round it silently: build the model "
                              f"in {md.properties.dtype} (torch.set_default_dtype) or convert the "
                              "checkpoint")


def verify(path: str | os.PathLike, expected: dict | None = None,
           part: tuple[int, int] = (0, 1)) -> Metadata:
    """Check the checkpoint at `path`: its metadata, its files and their sizes, the keys, shapes and
    dtypes in `expected` (see `check_keys`; None: not checked) and, last, the CRC-32 of every chunk of
    this rank's share of the data files (`part` = (rank, world): files[rank::world]; (0, 1): all)."""
    metadata = read_metadata(path)
    files = checksums.read(path)
    check_files(path, metadata, files)
    if expected is not None:
        check_keys(path, metadata, expected)
    names = sorted({info.relative_path for info in (metadata.storage_data or {}).values()})
    checksums.check(path, files, checksums.share(names, *part))
    return metadata
