"""Chapter 9, part 5: the 3D-parallel run (dp x pp x tp) saved at step k and resumed on another mesh.

One launch of 4 ranks. The uninterrupted run at (dp,pp,tp) = (1,2,2) equals one process (losses, first
gradients, final parameters); it saves after step SAVE_AT, each pipeline stage writing its own keys as
DTensors on its (dp, tp) sub-mesh, and DCP's metadata then covers every key exactly once (the tied
embedding's second copy is not written). That checkpoint is loaded at (2,2,1), (4,1,1) and (1,4,1), each
with another ZeRO stage, and trained on: every loss curve and every final parameter equals the
single-process run. A (2,1,2) run with ZeRO stage 2 (Adam's state cut over dp) saves, and (1,2,2) loads
it. One format: a checkpoint of the dp x tp `checkpoint.train.Trainer` at (2, 2) loads into the 3D
trainer at (1,2,2) and goes on like one process. Negative control: a load whose Adam state is then
thrown away ends elsewhere.

Tolerance 1e-10 in float64: the meshes add the same terms in other orders, a few 1e-16 relative per
step; a lost optimizer state moves the parameters by ~lr = 1e-2.
"""

from __future__ import annotations

import functools
import math
import shutil
import tempfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from distlab import launch
from distlab.mesh import grid
from distlab.models import GPTConfig
from distlab.parallel3d import Plan3D, Trainer3D, checkpoint, compare, make_batches, reference_run, train_3d
from distlab.parallel3d.checkpoint.train import TrainConfig, Trainer, dataset, global_batch, reference_losses
from distlab.parallel3d.checkpoint.verify import verify
from distlab.tensor_parallel import shard_state_dict

TOL = 1e-10
CONFIG = GPTConfig(vocab_size=8, block_size=4, n_layer=4, n_head=2, n_embd=8)
BATCH, SEQ, STEPS, SAVE_AT, SEED = 8, 4, 4, 2, 5
BATCHES = make_batches(CONFIG, BATCH, SEQ, STEPS, seed=SEED)
SAVER = Plan3D(dp=1, pp=2, tp=2, m=2, zero_stage=1)
TARGETS = [Plan3D(dp=2, pp=2, tp=1, m=2, schedule="gpipe", zero_stage=2),
           Plan3D(dp=4, pp=1, tp=1, m=1, zero_stage=1),
           Plan3D(dp=1, pp=4, tp=1, m=2, zero_stage=0)]
ZERO_SAVER, ZERO_TARGET = Plan3D(dp=2, pp=1, tp=2, m=2, zero_stage=2), SAVER


def _trainer(plan: Plan3D) -> tuple[Trainer3D, object]:
    m = grid(dp=plan.dp, pp=plan.pp, tp=plan.tp)
    return Trainer3D(m, CONFIG, plan, BATCH, SEQ, seed=SEED), m


def _run_on(trainer: Trainer3D, save: tuple[object, Path] | None = None) -> dict:
    """Train to STEPS (saving after SAVE_AT if asked); this rank's coordinates, losses and parameters."""
    losses = {}
    while trainer.step < STEPS:
        step = trainer.step
        losses[step] = trainer.train_step(*BATCHES[step])
        if save is not None and trainer.step == SAVE_AT:
            checkpoint.save(trainer, save[0], save[1])
    out = {"coords": trainer.coords, "losses": losses, "params": trainer.state()}
    trainer.close()
    return out


def _coverage(path: Path) -> dict[str, tuple[int, int]]:
    """{key: (elements in its stored chunks, elements of its global shape)} from DCP's metadata."""
    return {key: (sum(math.prod(c.sizes) for c in md.chunks), math.prod(md.size))
            for key, md in verify(path).state_dict_metadata.items() if isinstance(md, TensorStorageMetadata)}


def _resume(plan: Plan3D, path: Path, forget_adam: bool = False) -> dict:
    trainer, m = _trainer(plan)
    resumed = checkpoint.load(trainer, m, path)
    if forget_adam:  # the negative control: parameters back, Adam's state not
        for unit in trainer.zero.units:
            for t in unit.adam.state_tensors():
                t.zero_()
            unit.adam.step_count = 0
    return {"resumed": resumed, **_run_on(trainer)}


def _all(root: str) -> dict:
    out: dict = {"whole": train_3d(grid(dp=1, pp=2, tp=2), CONFIG, SAVER, BATCHES, seed=SEED)}
    path, zpath = Path(root) / "p3d", Path(root) / "zero"
    trainer, m = _trainer(SAVER)
    out["saver"] = _run_on(trainer, (m, path))
    out["coverage"] = _coverage(path)
    out["wte files"] = sorted({info.relative_path for index, info in verify(path).storage_data.items()
                               if index.fqn.endswith("wte.weight")})
    for plan in TARGETS:
        out[plan.label()] = _resume(plan, path)
    trainer, m = _trainer(ZERO_SAVER)
    out["zero saver"] = _run_on(trainer, (m, zpath))
    out["zero coverage"] = _coverage(zpath)
    out["zero target"] = _resume(ZERO_TARGET, zpath)
    out["forgetful"] = _resume(TARGETS[0], path, forget_adam=True)
    try:
        checkpoint.stage_mesh(grid(pp=4))
    except ValueError as e:
        out["pp only"] = str(e)
    out["from dp x tp"] = _from_dp_tp(Path(root) / "dp_tp")  # last: it sets the default dtype
    return out


def _from_dp_tp(path: Path) -> list[float]:
    """One format: the dp x tp `Trainer` saves after step 3 at (2, 2); `Trainer3D` loads it at (1,2,2)."""
    torch.set_default_dtype(torch.float64)  # checkpoint.train's model is built in float64
    cfg = TrainConfig()
    m = grid(dp=2, tp=2)
    small = Trainer(cfg, m)
    while small.step < 3:
        small.train_step()
    checkpoint.save(small, m, path)
    plan = Plan3D(dp=1, pp=2, tp=2, m=2, zero_stage=2)
    m = grid(dp=1, pp=2, tp=2)
    big = Trainer3D(m, cfg.gpt(), plan, cfg.batch_size, cfg.block_size, cfg.seed, cfg.lr)
    checkpoint.load(big, m, path)
    data = dataset(cfg)
    losses = [big.global_loss(big.train_step(*global_batch(cfg, data, step))) for step in range(3, 6)]
    big.close()
    return losses


@functools.cache
def _results() -> list[dict]:
    root = tempfile.mkdtemp()
    try:
        return launch.run(_all, 4, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@functools.cache
def _reference():
    return reference_run(CONFIG, BATCHES, seed=SEED)


def _differences(runs: list[dict], plan: Plan3D) -> tuple[float, float, int]:
    """The largest loss and parameter differences from one process, and the number of shards compared."""
    ref = _reference()
    loss_diff = param_diff = 0.0
    shards = 0
    replicas = [r["losses"] for r in runs if r["coords"]["pp"] == plan.pp - 1]
    for step in replicas[0]:
        mean = sum(r[step] for r in replicas) / len(replicas)
        loss_diff = max(loss_diff, abs(mean - ref.losses[step]))
    for r in runs:
        want = shard_state_dict(ref.params, CONFIG, r["coords"]["tp"], plan.tp)
        for name, p in r["params"].items():
            param_diff = max(param_diff, (p - want[name]).abs().max().item())
            shards += 1
    return loss_diff, param_diff, shards


def test_the_uninterrupted_3d_run_equals_one_process():
    runs = [r["whole"] for r in _results()]
    parity = compare(runs, _reference(), CONFIG, SAVER)
    assert parity.passed, parity
    saver = [r["saver"] for r in _results()]
    assert max(_differences(saver, SAVER)[:2]) < TOL


def test_each_stage_writes_its_keys_once_and_the_tied_copy_is_not_written():
    first, names = _results()[0], set(_reference().params)
    for coverage in (first["coverage"], first["zero coverage"]):  # pp=2 stages; dp=2 replicas
        tensors = {k: v for k, v in coverage.items() if k.startswith(("model.", "optim."))}
        assert tensors and all(stored == total for stored, total in tensors.values()), tensors
        assert {k.removeprefix("model.") for k in tensors if k.startswith("model.")} == names
        assert len(tensors) == 3 * len(names)  # parameter, exp_avg, exp_avg_sq
        assert coverage["model.h.0.attn.c_attn.weight"][1] == 3 * CONFIG.n_embd * CONFIG.n_embd
    assert first["wte files"] == ["__0_0.distcp", "__1_0.distcp"]  # ranks 0 and 1: stage 0 of (1,2,2)


def test_a_mesh_of_pipeline_stages_only_is_refused_by_name():
    assert "mesh dims ['pp']" in _results()[0]["pp only"]
    assert "distlab.mesh.grid(dp=..., pp=..., tp=...)" in _results()[0]["pp only"]


def test_resumed_on_other_pipeline_shapes_equals_the_uninterrupted_run():
    results = _results()
    for plan in TARGETS:
        runs = [r[plan.label()] for r in results]
        assert all(r["resumed"] == SAVE_AT for r in runs)
        assert all(sorted(r["losses"]) == list(range(SAVE_AT, STEPS)) for r in runs)
        loss_diff, param_diff, shards = _differences(runs, plan)
        assert loss_diff < TOL and param_diff < TOL, (plan.label(), loss_diff, param_diff)
        assert {n for r in runs for n in r["params"]} == set(_reference().params)  # every tensor, somewhere
        assert shards >= len(_reference().params)


def test_zero_sharded_adam_state_reshards_from_dp_tp_to_pp_tp():
    results = _results()
    saver = [r["zero saver"] for r in results]
    assert max(_differences(saver, ZERO_SAVER)[:2]) < TOL
    target = [r["zero target"] for r in results]
    assert all(r["resumed"] == SAVE_AT for r in target)
    assert max(_differences(target, ZERO_TARGET)[:2]) < TOL


def test_a_dp_tp_checkpoint_loads_into_the_3d_trainer():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        want = reference_losses(TrainConfig(), 6)[3:]
    finally:
        torch.set_default_dtype(old)
    for r in _results():  # global_loss: the same value on every rank
        assert all(abs(a - b) < TOL for a, b in zip(r["from dp x tp"], want, strict=True))


def test_a_resume_without_the_optimizer_state_is_caught():
    runs = [r["forgetful"] for r in _results()]
    loss_diff, param_diff, _ = _differences(runs, TARGETS[0])
    assert param_diff > 1e-4  # Adam restarted from zero state takes steps of ~lr, not the saved ones
