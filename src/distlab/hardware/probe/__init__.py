"""What this machine has, probed without starting any process that needs a GPU.

- `report`: `probe()` puts every probe together into a `Probe`, and `render` prints it;
- `gpus`: GPUs and their NVLinks (NVML, else nvidia-smi) and the GPU/NIC interconnect matrix;
- `host`: PCIe links, InfiniBand/RoCE ports, NUMA nodes and memory, read from sysfs and procfs.

`distlab doctor` reads the same functions.
"""

from distlab.hardware.probe.report import Probe, probe, render

__all__ = ["Probe", "probe", "render"]
