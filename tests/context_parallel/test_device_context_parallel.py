"""Lab 10's rank code beyond its own cells runs on the rank's device (issue 34): chapter 10's measured saved
bytes, the Ulysses checks (plain and the hybrid with a ring) and the Ulysses-against-ring timing make their
tensors on `launch.device()` (or on the CPU, moved there), so that under NCCL on a GPU node they hand
NCCL CUDA tensors only. Played on gloo and the CPU with `gpu_check.strict.strict_devices`, where a tensor
made without a device is a meta tensor and a collective given one raises `DeviceError` naming the call
(before the fix, each of these did)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from distlab import launch


def _under_strict(name: str) -> object:
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.context_parallel.parity import attention_parity, ulysses_parity
    from distlab.context_parallel.saved_activations import measured_ring_bytes
    from distlab.context_parallel.ulysses_vs_ring import measure
    from distlab.gpu_check.strict import strict_devices

    hybrid = init_device_mesh(launch.device().type, (2, 2), mesh_dim_names=("ring", "ulysses"))
    with strict_devices():
        if name == "saved_bytes":
            return measured_ring_bytes(16, 1, 2, 4, "zigzag") > 0
        if name == "ring_parity":
            return attention_parity("zigzag", 0, 1, 2, 16, 4).passed
        if name == "ulysses_parity":
            return all(r.passed for r in (
                ulysses_parity("zigzag", heads=8, kv_heads=4, seq_len=16),
                ulysses_parity("zigzag", heads=4, kv_heads=2, seq_len=16, group=hybrid["ulysses"].get_group(),
                               ring_group=hybrid["ring"].get_group())))
        out = measure(32, 1, 4, 4, repeats=1)
        return out["p"] == dist.get_world_size() and out["ring"]["seconds"] > 0


@pytest.mark.parametrize("name", ["saved_bytes", "ring_parity", "ulysses_parity", "timing"])
def test_chapter_10s_rank_code_makes_its_tensors_on_the_ranks_device(name: str) -> None:
    assert launch.run(_under_strict, 4, name, backend="gloo") == [True] * 4
