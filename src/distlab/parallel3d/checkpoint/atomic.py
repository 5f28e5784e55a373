"""Replace a checkpoint directory so that a crash at any moment leaves one complete checkpoint to load.

A save into `<dir>` writes everything into `<dir>.tmp`, `checksums.json` last (itself written to a
side file and renamed, so it is whole or absent): a `.tmp` holding `checksums.json` is complete. Then,
if `<dir>` already holds an older checkpoint, it is renamed aside to `<dir>.old`; `<dir>.tmp` is renamed
to `<dir>`; only then is `<dir>.old` deleted. A rename within one directory is atomic on a POSIX file
system (rename(2)), so at every instant one of these holds a complete checkpoint:

| crash after                 | on disk                          | `resolve(<dir>)` reads |
| ---                         | ---                              | ---                    |
| part of the new data        | `<dir>`, `<dir>.tmp` incomplete  | `<dir>` (the old one)  |
| `checksums.json`            | `<dir>`, `<dir>.tmp` complete    | `<dir>` (the old one)  |
| `<dir>` -> `<dir>.old`      | `<dir>.old`, `<dir>.tmp` complete| `<dir>.tmp` (the new)  |
| `<dir>.tmp` -> `<dir>`      | `<dir>`, `<dir>.old`             | `<dir>` (the new one)  |

`load` and `latest` only read (`resolve`), so every rank may call them at once; the next `save` into
the same directory first repairs it on rank 0 (`recover`: promote a complete `.tmp`, else the aside copy,
then delete what is left over). The same protocol (write a temporary, rename into place) is how
torch.save users and DCP's own storage writers make single files atomic; here it covers a directory.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from distlab.parallel3d.checkpoint.checksums import FILE as DONE

_STEP = re.compile(r"step_(\d+)(\.tmp|\.old)?")


def tmp_of(final: Path) -> Path:
    """Where a save into `final` writes before it renames (`<final>.tmp`)."""
    return final.with_name(final.name + ".tmp")


def aside_of(final: Path) -> Path:
    """Where the checkpoint that `final` held waits while the new one is renamed in (`<final>.old`)."""
    return final.with_name(final.name + ".old")


def complete(path: Path) -> bool:
    """Whether the save into `path` finished: `checksums.json`, written last, is there."""
    return (path / DONE).is_file()


def resolve(final: Path) -> Path:
    """The directory that holds the checkpoint named `final`: `final` itself, or, after a crash between
    the renames of a save, its complete `.tmp` (the newer) or its aside copy. `final` when none exists."""
    if final.is_dir():
        return final
    for candidate in (tmp_of(final), aside_of(final)):
        if candidate.is_dir() and complete(candidate):
            return candidate
    return final


def rename(src: Path, dst: Path) -> None:
    """`src` -> `dst` (atomic), then the parent directory flushed so that the rename survives a crash."""
    src.rename(dst)
    _sync_dir(dst.parent)


def remove(path: Path) -> None:
    """Delete the directory `path`, first its `checksums.json`, so that a deletion cut off halfway never
    leaves something that looks complete."""
    (path / DONE).unlink(missing_ok=True)
    shutil.rmtree(path)


def recover(final: Path) -> None:
    """Rank 0, before a save into `final`: finish what a crashed save left (a complete `.tmp` or the aside
    copy becomes `final` if `final` is gone), then delete the leftovers."""
    tmp, aside = tmp_of(final), aside_of(final)
    if not final.exists():
        found = resolve(final)
        if found != final:
            rename(found, final)
    for leftover in (tmp, aside):
        if leftover.is_dir():
            remove(leftover)


def commit(tmp: Path, final: Path) -> None:
    """Put the complete checkpoint `tmp` in place of `final`: the old one aside, the new in, the old gone."""
    aside = aside_of(final)
    if final.exists():
        rename(final, aside)
    rename(tmp, final)
    if aside.exists():
        remove(aside)


def steps(root: Path) -> dict[int, Path]:
    """{step: `root/step_N` as `step_dir` names it} for every checkpoint under `root` that `resolve`
    can read (its own directory, a complete `.tmp`, or an aside copy)."""
    found: dict[int, Path] = {}
    for path in root.glob("step_*"):
        match = _STEP.fullmatch(path.name)
        if match is None or not path.is_dir():
            continue
        final = root / f"step_{match.group(1)}"
        if match.group(2) is None or complete(path):
            found[int(match.group(1))] = final
    return found


def _sync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename itself is still atomic
    finally:
        os.close(fd)
