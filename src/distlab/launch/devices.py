"""Which device a rank's tensors live on: the one rule behind `launch.device()`.

Under NCCL every rank owns one GPU, `cuda:<local rank>` (NCCL takes CUDA tensors only). Under gloo the
ranks share the machine: their tensors are on the CPU, unless the environment variable `DISTLAB_DEVICE`
says `cuda`, and then rank r's tensors are on GPU r mod (number of GPUs): several ranks share one GPU,
gloo moving CUDA tensors. That is how a node with fewer GPUs than ranks (one GPU and a lab's
`run(fn, 4)`) still runs the code paths of one GPU per rank (`make gpu-check`'s shared mode). The
variable travels to the ranks with the launcher's environment; it is read in the rank, so the same
function run by `launch.run` or under torchrun follows it.
"""

from __future__ import annotations

import os

import torch

DEVICE_VAR = "DISTLAB_DEVICE"
DEVICE_CHOICES = ("cpu", "cuda")


def declared() -> str:
    """What `DISTLAB_DEVICE` asks gloo ranks to use: "cpu" (the default) or "cuda"."""
    value = os.environ.get(DEVICE_VAR, "cpu").strip().lower() or "cpu"
    if value not in DEVICE_CHOICES:
        raise ValueError(f"{DEVICE_VAR}={value!r} is not known: set it to 'cpu' (gloo ranks on the CPU, the "
                         "default) or 'cuda' (gloo ranks share the node's GPUs), or unset it")
    return value


def rank_device(backend: str, local_rank: int, gpus: int, gloo_device: str = "cpu") -> torch.device:
    """The device of the rank with index `local_rank` on its machine, on `backend`, with `gpus` GPUs.

    nccl: `cuda:<local_rank>` (one GPU per rank; `launch.resolve_backend` made sure there are enough);
    gloo: the CPU, or with `gloo_device="cuda"` GPU `local_rank % gpus` (ranks share GPUs)."""
    if backend == "nccl":
        if local_rank >= gpus:
            raise ValueError(f"an NCCL rank needs a GPU of its own: local rank {local_rank} but {gpus} "
                             "GPU(s) are visible; start at most as many ranks as GPUs, or use gloo")
        return torch.device("cuda", local_rank)
    if gloo_device == "cuda":
        if gpus < 1:
            raise ValueError(f"{DEVICE_VAR}=cuda asks gloo ranks to put their tensors on a GPU, but no CUDA "
                             f"GPU is visible; unset {DEVICE_VAR} to run on the CPU")
        return torch.device("cuda", local_rank % gpus)
    return torch.device("cpu")


def visible_gpus() -> int:
    """How many CUDA GPUs this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
