"""The one error a damaged, partial or mismatched checkpoint raises, and how DCP's own errors become it.

DCP reports a failed load as `CheckpointException`, which subclasses `BaseException` (so `except
Exception` lets it through) and carries each rank's traceback; torch's unpickler, asked to read a
damaged chunk, adds advice to load it with `weights_only=False`, which is the wrong fix for damage.
`from_dcp` turns it into a `CheckpointError` that names the checkpoint, the ranks and what failed.
"""

from __future__ import annotations

import os

from torch.distributed.checkpoint.api import CheckpointException


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded as it is: missing, truncated, damaged, or of another model."""


def _causes(error: BaseException) -> str:
    """Each failing rank's error type and the first line of its message, on one line."""
    if isinstance(error, CheckpointException):
        causes = {rank: exc for rank, (exc, _trace) in sorted(error.failures.items())}
    else:
        causes = {None: error}
    return "; ".join(
        (f"rank {rank}: " if rank is not None else "")
        + f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
        for rank, exc in causes.items())


def from_dcp(path: str | os.PathLike, error: BaseException) -> CheckpointError:
    """A `CheckpointError` for DCP's failure `error` (a CheckpointException or an ordinary exception)
    while loading `path`: each failing rank's error type and the first line of its message."""
    return CheckpointError(f"loading the checkpoint {path} failed while reading its data "
                           f"({_causes(error)}); its files passed the checks of checkpoint.verify, so they "
                           "were written damaged or changed since: load an earlier checkpoint (loading it "
                           "with weights_only=False would not repair it)")


def from_dcp_save(path: str | os.PathLike, error: BaseException) -> CheckpointError:
    """A `CheckpointError` for a failed save into `path` (disk full, no write permission, ...): the cause
    on one line, per rank, instead of DCP's `CheckpointException ranks:dict_keys([...])` and its
    tracebacks. The checkpoint `path` held before, if any, is untouched (the save wrote only `.tmp`)."""
    return CheckpointError(f"saving the checkpoint {path} failed while writing {path}.tmp "
                           f"({_causes(error)}); the checkpoint {path} held before, if any, is intact: "
                           "free space or fix the directory's permissions, then save again")
