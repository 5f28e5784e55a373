"""What this machine has: GPUs and how they are wired, PCIe links, RDMA ports, NUMA nodes, memory.

Every probe is guarded: a laptop with no GPU, no nvidia-smi, no InfiniBand and no /sys still gets a full
`Probe`, which says plainly what is absent. The file-system roots (`sys_root`, `proc_root`), the
nvidia-smi runner (`smi`) and the NVML module (`nvml`) are parameters, so tests feed fake trees and fake
command output. `distlab doctor` reads the same functions. The GPU probes live in `gpus.py`,
the sysfs and procfs readers in `host.py` (import their names from there); this file puts them
together.

Sources of each fact, in the order tried:
- GPUs and their NVLink state: NVML through ``pynvml`` when it imports, else ``nvidia-smi``;
- the GPU/NIC interconnect matrix: ``nvidia-smi topo -m`` (NV# = # NVLinks, PIX/PXB = through PCIe
  switches, NODE = within a NUMA node, SYS = across the CPU interconnect);
- PCIe generation and width: /sys/bus/pci/devices/*/current_link_speed and current_link_width
  (NVIDIA devices only, vendor 0x10de), with the catalog's generation for that speed;
- InfiniBand and RoCE ports: /sys/class/infiniband/*/ports/*/{state,rate,link_layer};
- NUMA nodes: /sys/devices/system/node/node*/cpulist and meminfo; total memory: /proc/meminfo.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from distlab.hardware.probe.gpus import (
    NO_GPU_PROBE,
    GPUInfo,
    SmiRunner,
    load_nvml,
    nvml_gpus,
    run_nvidia_smi,
    smi_gpus,
)
from distlab.hardware.probe.host import (
    IBDevice,
    NumaNode,
    PCIeLink,
    read_infiniband,
    read_meminfo,
    read_numa,
    read_pcie_links,
)


@dataclass
class Probe:
    """Everything the probes found. ``str(probe)`` is a plain-text report."""
    gpus: list[GPUInfo]
    gpu_source: str | None
    driver: str | None
    topology: str | None
    nvlink: str | None
    pcie: list[PCIeLink]
    infiniband: list[IBDevice]
    numa: list[NumaNode]
    memory: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return render(self)


def probe(sys_root: str | Path = "/sys", proc_root: str | Path = "/proc", smi: SmiRunner = run_nvidia_smi,
          nvml: ModuleType | None | bool = True) -> Probe:
    """Probe this machine. ``nvml=True`` tries pynvml, ``False`` skips it, a module object is used as is."""
    sys_root = Path(sys_root)
    module = load_nvml() if nvml is True else (nvml or None)
    nvlink = smi(["nvlink", "--status"])
    gpus, driver, source = [], None, None
    if module is not None:
        try:
            gpus, driver = nvml_gpus(module)
            source = "NVML (pynvml)"
        except Exception:  # a broken NVML falls back to nvidia-smi
            gpus = []
    if not gpus:
        gpus, driver = smi_gpus(smi, nvlink)
        source = "nvidia-smi" if gpus else None
    return Probe(gpus=gpus, gpu_source=source, driver=driver, topology=smi(["topo", "-m"]), nvlink=nvlink,
                 pcie=read_pcie_links(sys_root / "bus" / "pci" / "devices"),
                 infiniband=read_infiniband(sys_root / "class" / "infiniband"),
                 numa=read_numa(sys_root / "devices" / "system" / "node"),
                 memory=read_meminfo(Path(proc_root) / "meminfo"))


def render(p: Probe) -> str:
    """Plain-text view of a probe, one section per topic."""
    lines = _gpu_lines(p) + _link_lines(p) + _numa_lines(p)
    if p.memory:
        lines.append(f"Memory: {p.memory.get('MemTotal', 0):.1f} GiB total")
    return "\n".join(lines)


def _gpu_lines(p: Probe) -> list[str]:
    lines = ["GPUs" + (f" (from {p.gpu_source}; driver {p.driver or '?'}):" if p.gpus else ":")]
    lines += [f"  GPU{g.index}: {g.name}" + (f", {g.nvlinks_active} NVLink(s) active"
                                              if g.nvlinks_active is not None else "") for g in p.gpus]
    return lines if p.gpus else [*lines, "  " + NO_GPU_PROBE]


def _link_lines(p: Probe) -> list[str]:
    lines = ["PCIe links of NVIDIA devices (sysfs):"]
    lines += [f"  {k.address}: {k.speed_gt_s or '?'} GT/s x{k.width or '?'} ({k.generation or 'unknown'}; "
              f"max {k.max_speed_gt_s or '?'} GT/s x{k.max_width or '?'})" for k in p.pcie] or ["  none"]
    lines.append("InfiniBand / RoCE ports (sysfs):")
    lines += [f"  {d.name} port {q.port}: {q.state}, {q.rate}, {q.link_layer}" for d in p.infiniband
              for q in d.ports] or ["  none (multi-node traffic would use TCP sockets)"]
    return lines


def _numa_lines(p: Probe) -> list[str]:
    nodes = [f"  node{n.node}: CPUs {n.cpus}" + (f", {n.memory_gib:.1f} GiB" if n.memory_gib else "")
             for n in p.numa]
    return ["NUMA nodes:", *(nodes or ["  none reported"])]
