"""Chapter 9: checkpoints that survive a crash at any point of a save, `latest` by the integer step, and
the clear errors of a failed save, a path that is a file, and swapped shard files.

The crash is injected inside one rank: `Path.rename` and `shutil.rmtree`, the file operations a save
uses to put its new directory in place, raise `_Crash` (a BaseException, as a kill would leave no
handler running) at the k-th call, for every k. After each crash, `latest` and `load` must find a
complete checkpoint (the old one or the new one), and the next save into the same directory must work
and leave nothing behind.
"""

from __future__ import annotations

import errno
import functools
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from distlab import launch, mesh
from distlab.parallel3d import checkpoint
from distlab.parallel3d.checkpoint.train import TrainConfig, Trainer
from distlab.parallel3d.checkpoint.verify import CheckpointError


class _Crash(BaseException):
    pass


def _crash_at(k: int, calls: list[str]):
    """Patch Path.rename and shutil.rmtree to raise _Crash at their k-th call on a directory (counted in
    `calls`)."""
    rename, rmtree = Path.rename, shutil.rmtree

    def counted(name, fn):
        def op(path, *args, **kwargs):
            if not Path(path).is_dir():  # DCP's own rename of .metadata is not a step of the swap
                return fn(path, *args, **kwargs)
            calls.append(name)
            if len(calls) - 1 == k:
                raise _Crash(name)
            return fn(path, *args, **kwargs)
        return op

    Path.rename = counted("rename", rename)
    shutil.rmtree = counted("rmtree", rmtree)
    return lambda: (setattr(Path, "rename", rename), setattr(shutil, "rmtree", rmtree))


def _crashes(root: str) -> dict:
    torch.set_default_dtype(torch.float64)
    m = mesh.grid(dp=1, tp=1)
    out: dict = {}
    trainer = Trainer(TrainConfig(), m)
    trainer.train_step()
    trainer.train_step()
    for k in range(4):  # the old save used 2 operations, this one 3; one more to see a save that finishes
        case = Path(root) / f"crash{k}"
        final = checkpoint.step_dir(case, 2)
        checkpoint.save(trainer, m, final)  # the old checkpoint, at step 2
        trainer.train_step()  # step 3, saved into the same directory
        calls: list[str] = []
        undo = _crash_at(k, calls)
        try:
            checkpoint.save(trainer, m, final)
            crashed = False
        except _Crash:
            crashed = True
        finally:
            undo()
        found = checkpoint.latest(case)
        try:
            step = checkpoint.load(Trainer(TrainConfig(), m), m, found if found is not None else final)
        except CheckpointError as e:
            step = str(e)
        checkpoint.save(trainer, m, final)  # the next save into the same directory
        again = checkpoint.load(Trainer(TrainConfig(), m), m, final)
        out[k] = {"crashed": crashed, "latest": found == final, "step": step, "again": again,
                  "left": sorted(p.name for p in case.iterdir())}
        trainer = Trainer(TrainConfig(), m)
        trainer.train_step()
        trainer.train_step()
    torch.set_default_dtype(torch.float32)
    return out


@functools.cache
def _crash_results() -> dict:
    root = tempfile.mkdtemp()
    try:
        return launch.run(_crashes, 1, root)[0]
    finally:
        shutil.rmtree(root)


@pytest.mark.parametrize("k", range(4))
def test_a_crash_at_any_point_of_a_resave_leaves_a_checkpoint_to_load(k):
    out = _crash_results()[k]
    assert out["step"] in (2, 3), out  # the old or the new one, never none
    assert out["latest"], out
    assert out["again"] == 3 and out["left"] == ["step_000002"], out


def test_latest_orders_by_the_integer_step_and_recovers_a_complete_tmp(tmp_path):
    for name in ("step_999999", "step_1000000"):
        (tmp_path / name).mkdir()
    assert checkpoint.latest(tmp_path) == tmp_path / "step_1000000"
    done = tmp_path / "step_1000001.tmp"  # a save cut off between its renames: complete, not in place
    done.mkdir()
    (done / "checksums.json").write_text("{}")
    assert checkpoint.latest(tmp_path) == tmp_path / "step_1000001"
    (tmp_path / "step_1000002.tmp").mkdir()  # a save cut off while writing: skipped
    (tmp_path / "step_x").mkdir()
    assert checkpoint.latest(tmp_path) == tmp_path / "step_1000001"


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _save_errors(root: str) -> dict:
    from torch.distributed.checkpoint.filesystem import FileSystem
    torch.set_default_dtype(torch.float64)
    m = mesh.grid(dp=1, tp=2)
    out: dict = {}
    trainer = Trainer(TrainConfig(), m)
    trainer.train_step()
    good = Path(root) / "good"
    checkpoint.save(trainer, m, good)
    trainer.train_step()
    create = FileSystem.create_stream
    FileSystem.create_stream = _no_space
    try:
        checkpoint.save(trainer, m, good)
    except CheckpointError as e:
        out["full"] = str(e)
    finally:
        FileSystem.create_stream = create
    out["intact"] = checkpoint.load(Trainer(TrainConfig(), m), m, good)
    a_file = Path(root) / "a_file"
    if torch.distributed.get_rank() == 0:
        a_file.write_text("not a checkpoint")
    torch.distributed.barrier()
    for name, call in (("load_file", lambda: checkpoint.load(trainer, m, a_file)),
                       ("save_file", lambda: checkpoint.save(trainer, m, a_file)),
                       ("save_under_file", lambda: checkpoint.save(trainer, m, a_file / "step_000001"))):
        try:
            call()
        except CheckpointError as e:
            out[name] = str(e)
    swapped = Path(root) / "swapped"
    if torch.distributed.get_rank() == 0:
        shutil.copytree(good, swapped)
        a, b = swapped / "__0_0.distcp", swapped / "__1_0.distcp"
        a.rename(swapped / "x")
        b.rename(a)
        (swapped / "x").rename(b)
    torch.distributed.barrier()
    try:
        checkpoint.load(Trainer(TrainConfig(), m), m, swapped)
    except CheckpointError as e:
        out["swapped"] = str(e)
    torch.set_default_dtype(torch.float32)
    return out


@functools.cache
def _save_error_results() -> list[dict]:
    root = tempfile.mkdtemp()
    try:
        return launch.run(_save_errors, 2, root)
    finally:
        shutil.rmtree(root)


def test_a_full_disk_during_save_is_one_line_naming_the_path_on_every_rank():
    for out in _save_error_results():
        message = out["full"]
        assert "saving the checkpoint" in message and "good" in message, message
        assert "No space left on device" in message and "is intact" in message, message
        assert "CheckpointException" not in message and "dict_keys" not in message, message
        assert "\n" not in message and len(message) < 800, message
        assert out["intact"] == 1


def test_a_path_that_is_a_file_is_named_as_a_file():
    out = _save_error_results()[0]
    assert "a_file is a file, not a checkpoint directory" in out["load_file"], out["load_file"]
    assert "a_file is a file, not a checkpoint directory" in out["save_file"], out["save_file"]
    assert "a_file is a file, not a directory" in out["save_under_file"], out["save_under_file"]


def test_swapped_shard_files_are_reported_as_swapped():
    message = _save_error_results()[0]["swapped"]
    assert "swapped or mismatched" in message and "truncated" not in message, message
