"""The device logic of a GPU node, guarded on CPU by faking the GPU count (issue 34, item 4).

With 1, 2, 4 or 8 GPUs and 1 to 8 ranks: the backend `launch.run`'s "auto" picks (NCCL with one GPU per
rank, otherwise gloo), the device each rank's tensors belong on (`launch.rank_device`: its own GPU on
NCCL; the CPU on gloo, or a shared GPU with DISTLAB_DEVICE=cuda), and the backend each chapter's
multi-rank exercise check launches with (the launch itself is stopped before any rank starts).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab import launch
from distlab.launch import devices, launcher

GPU_COUNTS = (0, 1, 2, 4, 8)
WORLD_SIZES = range(1, 9)


@pytest.fixture
def fake_gpus(monkeypatch):
    """A function that makes this process see `n` CUDA GPUs and an NCCL-capable torch."""

    def fake(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: True)

    return fake


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_auto_picks_nccl_only_with_a_gpu_per_rank_and_each_rank_its_own_gpu(fake_gpus, gpus):
    fake_gpus(gpus)
    for p in WORLD_SIZES:
        backend = launch.resolve_backend("auto", p)
        assert backend == ("nccl" if gpus >= p else "gloo"), (gpus, p)
        placed = [launch.rank_device(backend, r, gpus) for r in range(p)]
        if backend == "nccl":
            assert placed == [torch.device("cuda", r) for r in range(p)]  # one GPU each, none shared
        else:
            assert placed == [torch.device("cpu")] * p
        if gpus and backend == "gloo":  # DISTLAB_DEVICE=cuda: the ranks share the GPUs, round robin
            shared = [launch.rank_device("gloo", r, gpus, "cuda") for r in range(p)]
            assert shared == [torch.device("cuda", r % gpus) for r in range(p)]


def test_a_forced_nccl_needs_a_gpu_per_rank(fake_gpus):
    fake_gpus(2)
    assert launch.resolve_backend("nccl", 2) == "nccl"
    with pytest.raises(ValueError, match="world_size=4 but 2 are visible"):
        launch.resolve_backend("nccl", 4)
    with pytest.raises(ValueError, match="local rank 2 but 2 GPU"):
        launch.rank_device("nccl", 2, 2)


def test_distlab_device_is_checked_and_named(monkeypatch):
    monkeypatch.setenv(devices.DEVICE_VAR, "gpu")
    with pytest.raises(ValueError, match="DISTLAB_DEVICE='gpu' is not known"):
        devices.declared()
    with pytest.raises(ValueError, match="DISTLAB_DEVICE='gpu' is not known"):
        launch.run(lambda: 0, 2, backend="gloo")  # before any rank starts
    monkeypatch.setenv(devices.DEVICE_VAR, "CUDA")
    assert devices.declared() == "cuda"
    with pytest.raises(ValueError, match="no CUDA GPU is visible; unset DISTLAB_DEVICE"):
        launch.rank_device("gloo", 0, 0, "cuda")
    monkeypatch.delenv(devices.DEVICE_VAR)
    assert devices.declared() == "cpu"


class _Stopped(Exception):
    """Raised by the fake launch: the check's choice is recorded, no rank starts."""


def _checks() -> dict:
    """Each chapter's multi-rank exercise check, as a function of one world size p."""
    from distlab.collectives import ring_all_reduce
    from distlab.collectives.exercises import check_ring_all_reduce, check_two_level_all_reduce
    from distlab.data_parallel.exercises import check_bucketed_all_reduce
    from distlab.moe.exercises import check_expert_parallel
    from distlab.pipeline import exercises as pipeline_exercises
    from distlab.pipeline.schedules import one_f_one_b_order
    from distlab.tensor_parallel.exercises import check_tensor_parallel

    def one_f_one_b(p: int) -> None:  # its launch is of the chapter's fixed size, RUN_P
        pipeline_exercises.check_one_f_one_b(one_f_one_b_order)

    return {
        "collectives ring": lambda p: check_ring_all_reduce(ring_all_reduce, world_sizes=(p,),
                                                            progress=False),
        "collectives two-level": lambda p: check_two_level_all_reduce(
            lambda t, node, across: t, layouts=((1, p),), progress=False),
        "data_parallel": lambda p: check_bucketed_all_reduce(lambda bucket: None, world_sizes=(p,)),
        "moe": lambda p: check_expert_parallel(lambda layer, x: x, world_sizes=(p,)),
        "tensor_parallel": lambda p: check_tensor_parallel(*[lambda *a: a] * 4, world_sizes=(p,)),
        "pipeline": one_f_one_b,
    }


@pytest.mark.parametrize("gpus", (1, 2, 4, 8))
def test_every_chapter_check_launches_with_the_auto_rule(fake_gpus, monkeypatch, gpus):
    """The checks leave the choice to `launch.run`'s auto rule, so that on a GPU node their ranks get NCCL
    exactly when there is a GPU per rank (and then their tensors must be on `launch.device()`, which
    tests/gpu_check/test_device_strict.py checks on CPU)."""
    fake_gpus(gpus)
    seen: list[tuple[int, str]] = []

    def fake_launch(payload, world_size, backend, *rest):
        seen.append((world_size, backend))
        raise _Stopped

    monkeypatch.setattr(launcher, "_launch", fake_launch)
    for name, check in _checks().items():
        for p in (2, 4) if name != "pipeline" else (None,):
            seen.clear()
            with pytest.raises(_Stopped):
                check(p)
            ((world, backend),) = seen
            assert backend == ("nccl" if gpus >= world else "gloo"), (name, gpus, world, backend)
