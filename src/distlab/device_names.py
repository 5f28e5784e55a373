"""From a device name as torch and nvidia-smi print it ("NVIDIA H200") to the GPU's row in `distlab.catalog`.

`gpu_for_device(name)` is the one matcher that `distlab doctor`, chapter 8's bench, gpu-check's block timing
and `python -m distlab.plan --gpu` use; `describe(row)` is the line `distlab doctor` prints for a GPU.
"""

from __future__ import annotations

import re

from distlab import catalog

# Words in a device name that mark a different product from the catalog's SXM row of the same chip: a PCIe
# card ("NVIDIA H100 PCIe", "NVIDIA A100-PCIE-40GB") or an NVL board ("NVIDIA H100 NVL", "NVIDIA H200 NVL"),
# with other clocks, power and often other memory.
OTHER_FORM_FACTORS = ("PCIE", "NVL")


def gpu_for_device(device_name: str) -> catalog.GPU | None:
    """The catalog's GPU for a device name as torch or nvidia-smi print it, or None.

    "NVIDIA H100 80GB HBM3" -> H100, "NVIDIA H200" -> H200, "NVIDIA B200" -> B200, "NVIDIA GB200" -> GB200,
    "Tesla V100-SXM2-16GB" -> V100. The name is split into words at spaces, hyphens, underscores and slashes,
    and a row matches only a whole word, so "NVIDIA GB200" is not a B200 and "NVIDIA GH200 480GB" not an
    H200. A PCIe or NVL product (`OTHER_FORM_FACTORS`) gets None: its peaks are not the SXM row's.
    """
    words = re.split(r"[\s\-_/]+", str(device_name).upper())
    if any(w in OTHER_FORM_FACTORS for w in words):
        return None
    return next((row for row in catalog.TABLES["gpu"] if row.name.upper() in words), None)


def describe(gpu: catalog.GPU) -> str:
    """One line: memory, dense peaks and NVLink, each labelled dense or per direction."""
    peaks = [f"{gpu.dense_16bit_tflops:g} FP16/BF16"]
    peaks += [f"{v:g} {k}" for k, v in (("FP8", gpu.dense_fp8_tflops), ("FP4", gpu.dense_fp4_tflops))
              if v is not None]
    memory = f"{gpu.memory_GB:g} GB HBM at " if gpu.memory_GB is not None else "HBM at "
    return (f"{gpu.name} ({gpu.architecture}): {memory}{gpu.memory_GBps:g} GB/s; dense TFLOPS "
            f"{', '.join(peaks)}; {gpu.nvlink}, {gpu.nvlink_GBps_per_direction:g} GB/s per direction")
