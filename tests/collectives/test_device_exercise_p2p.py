"""Lab 1's ring exercise on ranks that share a GPU (issue 34, `make gpu-check`'s shared mode): the student's
function sends with `dist.isend`/`dist.recv` itself, which gloo cannot do with CUDA tensors, so on gloo the
check hands it CPU tensors (`own_messages_device`); on NCCL, and on gloo on the CPU, the rank's device as
before. The shared mode is faked inside a gloo rank (DISTLAB_DEVICE=cuda, one visible GPU): before, the
check made its tensors on cuda:0, which this machine has not, and the run failed."""

from __future__ import annotations

import os
from unittest import mock

import torch
import torch.distributed as dist

from distlab import launch
from distlab.collectives.all_reduce_diagnosis import own_messages_device


def test_own_messages_go_on_the_cpu_only_for_a_gpu_on_gloo() -> None:
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert own_messages_device(cuda, "gloo") == cpu
    assert own_messages_device(cuda, "nccl") == cuda
    assert own_messages_device(cpu, "gloo") == cpu


def _ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """A right solution of the exercise, with the student's tools: dist.isend and dist.recv."""
    from distlab.collectives import chunk_bounds

    r, p = dist.get_rank(), dist.get_world_size()
    chunks = [tensor.view(-1)[a:b] for a, b in chunk_bounds(tensor.numel(), p)]
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        send, recv = (r - s) % p, (r - s - 1) % p
        incoming = torch.empty_like(chunks[recv])
        request = dist.isend(chunks[send], right)
        dist.recv(incoming, left)
        request.wait()
        chunks[recv].add_(incoming)
    for s in range(p - 1):
        send, recv = (r - s + 1) % p, (r - s) % p
        request = dist.isend(chunks[send], right)
        dist.recv(chunks[recv], left)
        request.wait()
    return tensor


def _shared_mode_cases() -> list:
    from distlab.collectives.all_reduce_diagnosis import _run_cases

    with mock.patch.dict(os.environ, {"DISTLAB_DEVICE": "cuda"}), \
            mock.patch("distlab.launch.visible_gpus", lambda: 1):
        assert launch.device() == torch.device("cuda", 0)
        return _run_cases(_ring_all_reduce, [1, 5, 8], None)


def test_the_ring_check_runs_a_right_solution_where_ranks_share_a_gpu() -> None:
    for rank in launch.run(_shared_mode_cases, 3, backend="gloo"):
        assert rank == [[], [], []], rank
