"""What a GPU report names: the GPUs, the driver, CUDA, NCCL, torch, Python and the OS.

The driver and the GPUs' NVLinks come from chapter 8's probe (`distlab.hardware.probe`: NVML, else
nvidia-smi), the rest from torch itself (`torch.version.cuda`, `torch.cuda.nccl.version()`,
`torch.cuda.get_device_properties`), so the report says what this process actually ran on.
"""

from __future__ import annotations

import platform

import torch


def facts() -> dict:
    """The node: each GPU's model, memory and compute capability; driver, CUDA, NCCL, torch versions."""
    from distlab.hardware import probe

    found = probe.probe()
    gpus = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": p.name, "memory_GiB": round(p.total_memory / 2**30, 1),
                     "compute_capability": f"{p.major}.{p.minor}"})
    nccl = None
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    return {"gpus": gpus, "driver": found.driver, "cuda": torch.version.cuda, "nccl": nccl,
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}"}


def slug(env: dict) -> str:
    """A file name for the report: the first GPU's model in lower case, words joined by dashes, and the
    GPU count ("nvidia-h100-80gb-hbm3-x8")."""
    name = env["gpus"][0]["name"] if env.get("gpus") else "no-gpu"
    words = "".join(c if c.isalnum() else " " for c in name.lower()).split()
    return "-".join(words) + f"-x{len(env.get('gpus', []))}"
