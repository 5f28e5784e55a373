"""A CRC-32 of every chunk of a checkpoint, written at save and checked before load.

DCP keeps no checksums: a bit flipped on disk (or in a copy) inside a weight loads as a slightly wrong
weight, and inside Adam's `exp_avg_sq` as a NaN one step later. So `save` adds one file,
`checksums.json`, beside DCP's: for every chunk DCP wrote (a tensor's slice, or the pickled step and
RNG state), the file it lives in, its byte range and the CRC-32 of those bytes, and the CRC-32 of
`.metadata` itself. `check` recomputes them before anything is read into the model; a mismatch is a
`CheckpointError` naming the file, the key and the bytes.

CRC-32 (the IEEE 802.3 polynomial, Python's `zlib.crc32`) is a code for accidental damage, not a
cryptographic hash: every error burst of up to 32 bits is detected, and any other damage slips through
with probability about 2^-32 (Peterson and Brown 1961). It costs one read of the checkpoint, split
over the ranks: rank r checksums the data files `files[r::world]`, at save and at load.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

from torch.distributed.checkpoint.metadata import Metadata

from distlab.parallel3d.checkpoint.errors import CheckpointError

FILE = "checksums.json"
BLOCK = 1 << 24  # read 16 MiB at a time: a shard file may be larger than memory


def crc32(path: str | os.PathLike, start: int = 0, length: int | None = None) -> int:
    """The CRC-32 of `length` bytes of the file `path` from byte `start` (None: to the end)."""
    crc = 0
    with open(path, "rb") as fh:
        fh.seek(start)
        left = length if length is not None else os.fstat(fh.fileno()).st_size - start
        while left > 0:
            block = fh.read(min(BLOCK, left))
            if not block:
                break
            crc = zlib.crc32(block, crc)
            left -= len(block)
    return crc


def chunks(metadata: Metadata) -> dict[str, list[tuple[str, list[int], int, int]]]:
    """{data file: [(key, the chunk's offset in the key's tensor, first byte, length), ...]} from DCP's
    metadata, each file's chunks in the order they lie in it."""
    out: dict[str, list[tuple[str, list[int], int, int]]] = {}
    for index, info in (metadata.storage_data or {}).items():
        where = list(index.offset) if index.offset is not None else []
        out.setdefault(info.relative_path, []).append((index.fqn, where, info.offset, info.length))
    return {name: sorted(rows, key=lambda r: r[2]) for name, rows in sorted(out.items())}


def share(names: Sequence[str], rank: int, world: int) -> list[str]:
    """The data files rank `rank` of `world` checksums: every world-th one, from the rank-th."""
    return sorted(names)[rank::world]


def compute(root: str | os.PathLike, metadata: Metadata, files: Sequence[str]) -> dict[str, dict]:
    """{file: {"size": bytes, "chunks": [[key, offset, first byte, length, crc32], ...]}} for `files`."""
    table = chunks(metadata)
    out = {}
    for name in files:
        path = Path(root) / name
        out[name] = {"size": path.stat().st_size,
                     "chunks": [[key, where, start, length, crc32(path, start, length)]
                                for key, where, start, length in table[name]]}
    return out


def write(root: str | os.PathLike, parts: Sequence[dict[str, dict]]) -> None:
    """Write `checksums.json` into `root`: the files' tables (`parts`, one per rank) and `.metadata`'s
    CRC-32. Call it once (rank 0), after DCP has written `.metadata`."""
    files: dict[str, dict] = {}
    for part in parts:
        files.update(part)
    doc = {"algorithm": "crc32", "metadata": crc32(Path(root) / ".metadata"), "files": files}
    part = Path(root) / (FILE + ".part")  # renamed into place: checksums.json is whole or absent, and
    with open(part, "w") as fh:           # its presence marks a finished save (`atomic.complete`)
        fh.write(json.dumps(doc, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(part, Path(root) / FILE)


def read(root: str | os.PathLike) -> dict:
    """`checksums.json` of the checkpoint `root`, checked against `.metadata`'s bytes."""
    path = Path(root) / FILE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: the checkpoint has no checksums, so damage inside its "
                              "files could not be seen; write it with distlab.parallel3d.checkpoint.save, "
                              "or load an earlier checkpoint")
    try:
        doc = json.loads(path.read_text())
        files, want = doc["files"], int(doc["metadata"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} cannot be read ({type(e).__name__}: {e}); the file is damaged, "
                              "load an earlier checkpoint instead") from e
    meta = Path(root) / ".metadata"
    if meta.is_file() and crc32(meta) != want:
        raise CheckpointError(f"{meta} is damaged: its CRC-32 is {crc32(meta):#010x}, but the save wrote "
                              f"{want:#010x} into {FILE}; load an earlier checkpoint")
    return files


def check(root: str | os.PathLike, files: dict[str, dict], names: Sequence[str]) -> None:
    """Recompute the CRC-32 of every chunk of the data files `names`; a CheckpointError at the first
    chunk whose bytes differ from what the save wrote, naming the file, the key and the bytes."""
    for name in names:
        path = Path(root) / name
        if name not in files:
            raise CheckpointError(f"shard file {path} has no entry in {FILE}: it was not written by the save "
                                  "that wrote the checksums; load an earlier checkpoint")
        for key, where, start, length, want in files[name]["chunks"]:
            got = crc32(path, start, length)
            if got != want:
                twin = _holds_file_of(path, name, files)
                if twin is not None:
                    raise CheckpointError(
                        f"shard file {path} holds the bytes the save wrote into {twin}: the files were "
                        "swapped or mismatched (renamed or copied in from elsewhere); restore them, or load "
                        "an earlier checkpoint")
                at = f" (its chunk at offset {tuple(where)})" if where and any(where) else ""
                raise CheckpointError(
                    f"shard file {path} is damaged: the bytes {start}..{start + length - 1} of key "
                    f"{key!r}{at} have CRC-32 {got:#010x}, but the save wrote {want:#010x}; nothing was "
                    "loaded: load an earlier checkpoint (or copy this one again from its source)")


def _holds_file_of(path: Path, name: str, files: dict[str, dict]) -> str | None:
    """The other data file of this checkpoint whose recorded chunks `path` matches byte for byte (so the
    two were swapped), or None. Run only after a mismatch, so a healthy load never pays for it."""
    size = path.stat().st_size
    for other, entry in sorted(files.items()):
        if other == name or entry.get("size") != size:
            continue
        if all(crc32(path, start, length) == want for _k, _w, start, length, want in entry["chunks"]):
            return other
    return None
