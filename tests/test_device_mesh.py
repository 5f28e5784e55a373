"""`mesh.grid` builds its DeviceMesh on the rank's device type (issue 34): "cpu" for gloo ranks on the CPU,
"cuda" for gloo ranks that share a GPU (DISTLAB_DEVICE=cuda, `make gpu-check`'s shared mode) as for NCCL.
Before, a gloo rank always got a "cpu" mesh, whose collectives then met the rank's CUDA tensors.

On this CPU machine the shared mode is faked inside the rank: DISTLAB_DEVICE=cuda, one visible GPU, and
`init_device_mesh` replaced by a recorder (no CUDA mesh is built); the CPU case builds a real mesh."""

from __future__ import annotations

import os
from unittest import mock

import torch.distributed as dist

from distlab import launch, mesh


def _device_types() -> dict[str, str]:
    """Inside a rank: the device type grid() builds its mesh on, as the ranks run, and with the shared
    GPU mode faked."""
    out = {"cpu": mesh.grid(dp=dist.get_world_size()).device_type}
    asked: list[str] = []

    def record(device_type: str, *args: object, **kwargs: object) -> None:
        asked.append(device_type)

    with mock.patch.dict(os.environ, {"DISTLAB_DEVICE": "cuda"}), \
            mock.patch("distlab.launch.visible_gpus", lambda: 1), \
            mock.patch.object(mesh, "init_device_mesh", record):
        out["device"] = str(launch.device())
        mesh.grid(dp=dist.get_world_size())
        mesh.grid(dp=dist.get_world_size(), device_type="cpu")  # an explicit device_type still wins
    out["shared"], out["explicit"] = asked
    return out


def test_grid_follows_the_ranks_device_under_gloo() -> None:
    for rank in launch.run(_device_types, 2, backend="gloo"):
        assert rank == {"cpu": "cpu", "device": "cuda:0", "shared": "cuda", "explicit": "cpu"}, rank
