"""Chapter 7's PowerSGD comparison on CPU ranks of a machine that has a GPU (issue 34, cause 2).

PyTorch's PowerSGD hook calls `torch.cuda.synchronize(device)` whenever CUDA is available, with the
bucket's device, and that fails for the CPU ("Expected a cuda device, but got: cpu"): lab 7's comparison
crashed on a GPU node, whose labs run their ranks on gloo and the CPU when there are fewer GPUs than
ranks. Here the ranks are told that CUDA is available (`torch.cuda.is_available` returns True), which is
all the hook looks at; a CPU-only torch then fails in the same call if it is made for a CPU bucket.
"""

from __future__ import annotations

import torch

from distlab import launch


def _compare_as_on_a_gpu_node(steps: int) -> tuple[list, bool]:
    from distlab.memory.techniques import compression

    torch.cuda.is_available = lambda: True  # this rank's process only; it ends with the run
    synchronize = torch.cuda.synchronize
    results = compression.compare_compression(methods=("allreduce", "pytorch"), steps=steps)
    return results, torch.cuda.synchronize is synchronize


def test_pytorchs_powersgd_hook_runs_on_cpu_ranks_when_cuda_is_available():
    for (plain, powersgd), restored in launch.run(_compare_as_on_a_gpu_node, 2, 6):
        assert (plain.method, powersgd.method) == ("allreduce", "pytorch")
        assert 0 < powersgd.sent_bytes_per_step < plain.sent_bytes_per_step  # compressed from step 2 on
        assert abs(powersgd.final_loss - plain.final_loss) < 0.5 * plain.final_loss
        assert restored  # torch.cuda.synchronize is torch's own again after the hook
