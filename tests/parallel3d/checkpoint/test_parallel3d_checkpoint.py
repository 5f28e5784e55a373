"""Chapter 9, part 5: sharded checkpoints (distlab.parallel3d.checkpoint) that reshard, and that refuse a
damaged checkpoint by name.

One launch of 4 ranks trains 6 steps at grid(dp=2, tp=2), saving after step 3; then, in the same ranks,
builds grid(dp=4, tp=1) and grid(dp=1, tp=4), loads the checkpoint into each and trains on to step 6.
One launch of 1 rank saves, resumes, and tries each kind of damage: a file missing or cut short, a
single bit flipped in a weight, 8 bytes flipped in Adam's exp_avg_sq, a zero-filled shard, a damaged
`data.pkl` inside a chunk (also with checksums rewritten to match, so that DCP itself meets it), the
checkpoint of a deeper, shallower or wider model. Each is refused by name and leaves the model as it
was. In the 4-rank launch, a bit flipped in the file only rank 3 checksums is refused on every rank.
Every loss curve is compared with the single-process reference (the dense GPT with torch.optim.Adam on
the whole batch).

Tolerance 1e-10 on losses near 2.8, in float64: different meshes sum the same gradients in another order
(tp's all-reduce, ZeRO's reduce-scatter over dp), a few 2**-53 relative apart per step; after 6 Adam steps
at lr 1e-2 this stays below 1e-13. A lost optimizer state or a wrong shard moves the loss by ~1e-3.
"""

from __future__ import annotations

import functools
import io
import math
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from distlab import launch, mesh
from distlab.parallel3d import checkpoint
from distlab.parallel3d.checkpoint.train import TrainConfig, Trainer, dense_model, reference_losses
from distlab.parallel3d.checkpoint.verify import CheckpointError, verify

TOL = 1e-10
STEPS, SAVE_AT = 6, 3


def _train(trainer: Trainer, to_step: int, save: tuple[int, Path] | None = None,
           m: object = None) -> dict[int, float]:
    losses = {}
    while trainer.step < to_step:
        step = trainer.step
        losses[step] = trainer.train_step()
        if save is not None and trainer.step == save[0]:
            checkpoint.save(trainer, m, save[1])
    return losses


def _coverage(path: Path) -> dict[str, tuple[int, int]]:
    """{key: (elements in its stored chunks, elements of its global shape)} from DCP's metadata."""
    out = {}
    for key, md in verify(path).state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            out[key] = (sum(math.prod(c.sizes) for c in md.chunks), math.prod(md.size))
    return out


def _chunk(path: Path, key: str) -> tuple[Path, int, int]:
    """The data file, first byte and length of the (first) chunk of `key`, from DCP's own metadata."""
    for index, info in FileSystemReader(str(path)).read_metadata().storage_data.items():
        if index.fqn == key:
            return path / info.relative_path, info.offset, info.length
    raise KeyError(key)


def _flip(path: Path, key: str, nbytes: int, *, in_pickle: bool = False) -> None:
    """Flip bits of `key`'s chunk on disk: one bit (nbytes=0) or `nbytes` whole bytes in the middle of its
    stored values, or `nbytes` bytes of its pickle (`archive/data.pkl` of the torch.save inside)."""
    file, start, length = _chunk(path, key)
    data = bytearray(file.read_bytes())
    chunk = bytes(data[start:start + length])
    if in_pickle:
        at = start + chunk.index(b"\x80\x02", chunk.index(b"data.pkl")) + 2
    else:
        values = torch.load(io.BytesIO(chunk), weights_only=True).contiguous()
        raw = values.numpy().tobytes()
        at = start + chunk.index(raw) + len(raw) // 2
    if nbytes == 0:
        data[at] ^= 0x01
    else:
        data[at:at + nbytes] = bytes(b ^ 0xFF for b in data[at:at + nbytes])
    file.write_bytes(bytes(data))


def _reshard(root: str) -> dict:
    torch.set_default_dtype(torch.float64)
    path = Path(root) / "ckpt"
    m22 = mesh.grid(dp=2, tp=2)
    full = _train(Trainer(TrainConfig(), m22), STEPS, (SAVE_AT, path), m22)
    out = {"full": full, "files": sorted(p.name for p in path.iterdir()), "coverage": _coverage(path)}
    for dp, tp in ((4, 1), (1, 4), (2, 2)):
        m = mesh.grid(dp=dp, tp=tp)
        trainer = Trainer(TrainConfig(), m)
        resumed = checkpoint.load(trainer, m, path)
        out[(dp, tp)] = (resumed, _train(trainer, STEPS))
    forgetful = Trainer(TrainConfig(), m22)  # a negative control: parameters back, Adam's state not
    checkpoint.load(forgetful, m22, path)
    for unit in forgetful.zero.units:
        unit.adam.exp_avg.zero_()
        unit.adam.exp_avg_sq.zero_()
        unit.adam.step_count = 0
    out["forgetful"] = _train(forgetful, SAVE_AT + 2)
    bad = Path(root) / "bad"  # a bit flipped in the file that only rank 3 checksums
    last = sorted(p.name for p in path.glob("*.distcp"))[-1]
    key = next(i.fqn for i, info in FileSystemReader(str(path)).read_metadata().storage_data.items()
               if info.relative_path == last and i.fqn.startswith("model."))
    if torch.distributed.get_rank() == 0:
        shutil.copytree(path, bad)
        _flip(bad, key, 0)
    torch.distributed.barrier()
    try:
        checkpoint.load(Trainer(TrainConfig(), m22), m22, bad)
        out["bad"] = None
    except CheckpointError as e:
        out["bad"] = (last, key, str(e))
    return out


@functools.cache
def _reshard_results() -> list[dict]:
    root = tempfile.mkdtemp()
    try:
        return launch.run(_reshard, 4, root)
    finally:
        shutil.rmtree(root)


@functools.cache
def _reference() -> list[float]:
    with _float64():
        return reference_losses(TrainConfig(), STEPS)


class _float64:
    def __enter__(self) -> None:
        self.old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)

    def __exit__(self, *exc: object) -> None:
        torch.set_default_dtype(self.old)


def _close(got: dict[int, float], want: list[float]) -> bool:
    return all(abs(got[s] - want[s]) < TOL for s in got)


def test_uninterrupted_run_on_a_2x2_mesh_equals_one_process():
    full = _reshard_results()[0]["full"]
    assert sorted(full) == list(range(STEPS))
    assert _close(full, _reference())


@pytest.mark.parametrize("target", [(4, 1), (1, 4), (2, 2)])
def test_resume_on_another_mesh_continues_the_same_loss_curve(target):
    for rank, out in enumerate(_reshard_results()):
        resumed, losses = out[target]
        assert resumed == SAVE_AT, rank
        assert sorted(losses) == list(range(SAVE_AT, STEPS))
        assert _close(losses, _reference()), (rank, target)
        assert all(abs(losses[s] - out["full"][s]) < TOL for s in losses)


def test_resume_without_the_optimizer_state_is_caught():
    forgetful = _reshard_results()[0]["forgetful"]
    assert abs(forgetful[SAVE_AT] - _reference()[SAVE_AT]) < TOL  # the parameters did come back
    assert abs(forgetful[SAVE_AT + 1] - _reference()[SAVE_AT + 1]) > 1e3 * TOL


def test_each_slice_is_written_once():
    out = _reshard_results()[0]
    assert ".metadata" in out["files"]
    assert sum(name.endswith(".distcp") for name in out["files"]) == 4  # one file per rank
    cov = out["coverage"]
    with _float64():
        names = [n for n, _ in dense_model(TrainConfig()).named_parameters()]
    for group in ("model", "optim.exp_avg", "optim.exp_avg_sq"):
        assert all(f"{group}.{n}" in cov for n in names), group
    # DCP stores each tp slice once, not once per dp replica: the chunks cover each tensor exactly
    assert all(stored == total for stored, total in cov.values()), cov


# ---------------------------------------------------------------- damaged checkpoints, on one rank


def _damage(root: str) -> dict:
    torch.set_default_dtype(torch.float64)
    m = mesh.grid(dp=1, tp=1)
    good = Path(root) / "good"
    saved = _train(Trainer(TrainConfig(), m), 4, (2, good), m)
    out: dict = {"saved": saved}
    resumed = Trainer(TrainConfig(), m)
    checkpoint.load(resumed, m, good)
    out["resumed"] = _train(resumed, 4)

    def attempt(name: str, path: Path, cfg: TrainConfig | None = None) -> None:
        trainer = Trainer(cfg or TrainConfig(), m)
        before = [p.local.clone() for p in trainer.params()]
        try:
            checkpoint.load(trainer, m, path)
            out[name] = None
        except CheckpointError as e:
            out[name] = str(e)
        after = trainer.params()
        out[name + "_untouched"] = all(torch.equal(a, p.local) for a, p in zip(before, after, strict=True))

    def copy(name: str) -> Path:
        return Path(shutil.copytree(good, Path(root) / name))

    shard = copy("no_shard") / "__0_0.distcp"
    shard.unlink()
    attempt("no_shard", shard.parent)
    short = copy("truncated") / "__0_0.distcp"
    short.write_bytes(short.read_bytes()[: short.stat().st_size // 2])
    attempt("truncated", short.parent)
    (copy("no_metadata") / ".metadata").unlink()
    attempt("no_metadata", Path(root) / "no_metadata")
    attempt("wider", good, TrainConfig(n_embd=12))
    attempt("deeper", good, TrainConfig(n_layer=3))
    attempt("shallower", good, TrainConfig(n_layer=1))
    attempt("nowhere", Path(root) / "nowhere")
    _flip(copy("weight_bit"), "model.h.0.attn.c_attn.weight", 0)
    attempt("weight_bit", Path(root) / "weight_bit")
    _flip(copy("adam_bytes"), "optim.exp_avg_sq.h.1.mlp.c_fc.weight", 8)
    attempt("adam_bytes", Path(root) / "adam_bytes")
    zeros = copy("zero_filled") / "__0_0.distcp"
    zeros.write_bytes(bytes(zeros.stat().st_size))
    attempt("zero_filled", zeros.parent)
    _flip(copy("data_pkl"), "model.h.1.ln_2.bias", 8, in_pickle=True)
    attempt("data_pkl", Path(root) / "data_pkl")
    (copy("no_checksums") / "checksums.json").unlink()
    attempt("no_checksums", Path(root) / "no_checksums")
    from distlab.parallel3d.checkpoint import checksums  # the damage as DCP itself meets it: sums rewritten
    for name in ("data_pkl", "zero_filled"):
        forged = Path(shutil.copytree(Path(root) / name, Path(root) / f"{name}_resummed"))
        meta = verify(good)
        checksums.write(forged, [checksums.compute(forged, meta, ["__0_0.distcp"])])
        attempt(f"{name}_resummed", forged)
    meta = verify(good)
    as_float32 = {k: (tuple(md.size), torch.float32 if k.startswith("model.") else md.properties.dtype)
                  for k, md in meta.state_dict_metadata.items()}
    try:
        verify(good, as_float32)
    except CheckpointError as e:
        out["float32_keys"] = str(e)
    only_dp = mesh.grid(dp=1)
    try:
        checkpoint.to_dtensor(resumed.params()[0], only_dp)
    except ValueError as e:
        out["no_tp_dim"] = str(e)
    torch.set_default_dtype(torch.float32)
    try:
        Trainer(TrainConfig(), m)
    except ValueError as e:
        out["float32"] = str(e)
    return out


@functools.cache
def _damage_results() -> dict:
    root = tempfile.mkdtemp()
    try:
        return launch.run(_damage, 1, root)[0]
    finally:
        shutil.rmtree(root)


def test_one_rank_save_and_resume_equals_one_process():
    out = _damage_results()
    assert _close(out["saved"], _reference())
    assert sorted(out["resumed"]) == [2, 3] and _close(out["resumed"], _reference())


@pytest.mark.parametrize(("case", "needles"), [
    ("no_shard", ["shard file", "no_shard/__0_0.distcp", "is missing", "load an earlier"]),
    ("truncated", ["shard file", "truncated/__0_0.distcp", "is truncated", "bytes"]),
    ("no_metadata", ["no_metadata/.metadata is missing", "did not finish"]),
    ("wider", ["key 'model.wte.weight' has shape (16, 8)", "needs (16, 12)", "another shape"]),
    ("deeper", ["key 'model.h.2.", "is missing from the checkpoint", "different model"]),
    ("shallower", ["has 36 key(s) the model does not have", "'model.h.1.", "larger", "configuration"]),
    ("nowhere", ["nowhere does not exist"]),
    ("weight_bit", ["weight_bit/__0_0.distcp is damaged", "key 'model.h.0.attn.c_attn.weight'",
                    "CRC-32", "nothing was loaded"]),
    ("adam_bytes", ["adam_bytes/__0_0.distcp is damaged", "key 'optim.exp_avg_sq.h.1.mlp.c_fc.weight'"]),
    ("zero_filled", ["zero_filled/__0_0.distcp is damaged", "key 'model.wte.weight'"]),
    ("data_pkl", ["data_pkl/__0_0.distcp is damaged", "key 'model.h.1.ln_2.bias'"]),
    ("no_checksums", ["no_checksums/checksums.json is missing", "load an earlier"]),
    ("data_pkl_resummed", ["loading the checkpoint", "data_pkl_resummed failed while reading its data",
                           "rank 0: ", "load an earlier checkpoint"]),
    ("zero_filled_resummed", ["zero_filled_resummed failed while reading its data", "rank 0: "]),
])
def test_damaged_checkpoint_fails_by_name_and_loads_nothing(case, needles):
    out = _damage_results()
    message = out[case]
    assert message is not None, f"{case}: loaded silently"
    for needle in needles:
        assert needle in message, (needle, message)
    assert out[case + "_untouched"]


def test_dcp_errors_become_the_course_error_without_the_weights_only_advice():
    out = _damage_results()
    for case in ("data_pkl_resummed", "zero_filled_resummed"):
        assert "CheckpointException" not in out[case] and "weights_only=False would not" in out[case]
        assert "Traceback" not in out[case]


def test_a_checkpoint_of_another_dtype_is_refused_by_name():
    message = _damage_results()["float32_keys"]
    assert "key 'model.wte.weight' is torch.float64 in the checkpoint" in message
    assert "model holds torch.float32" in message and "set_default_dtype" in message


def test_damage_seen_by_one_rank_is_refused_on_every_rank():
    results = _reshard_results()
    last, key, message = results[0]["bad"]
    assert f"bad/{last} is damaged" in message and repr(key) in message
    assert all(out["bad"] == (last, key, message) for out in results)


def test_latest_skips_unfinished_saves(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    for name in ("step_000003", "step_000006", "step_000009.tmp"):
        (tmp_path / name).mkdir()
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000006"
    assert checkpoint.step_dir(tmp_path, 12) == tmp_path / "step_000012"


def test_verify_without_ranks_names_the_missing_metadata(tmp_path):
    with pytest.raises(CheckpointError, match=r"\.metadata is missing: the save into .* did not finish"):
        verify(tmp_path)
    (tmp_path / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match=r"\.metadata cannot be read .* damaged"):
        verify(tmp_path)


def test_bad_mesh_and_dtype_are_refused_with_the_fix():
    out = _damage_results()
    assert "to_dtensor(tp_dim='tp'): the mesh has no axis 'tp'; its axes are ['dp']; build the mesh with " \
        "distlab.mesh.grid(dp=..., tp=...)" in out["no_tp_dim"]
    assert "must be torch.float64" in out["float32"] and "set_default_dtype" in out["float32"]
