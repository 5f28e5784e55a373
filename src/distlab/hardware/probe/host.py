"""What the kernel reports about the rest of the machine: PCIe links, RDMA ports, NUMA nodes, memory.

- PCIe generation and width: /sys/bus/pci/devices/*/current_link_speed and current_link_width
  (NVIDIA devices only, vendor 0x10de), with the catalog's generation for that speed;
- InfiniBand and RoCE ports: /sys/class/infiniband/*/ports/*/{state,rate,link_layer};
- NUMA nodes: /sys/devices/system/node/node*/cpulist and meminfo; total memory: /proc/meminfo.

Each reader takes its root as a parameter (tests feed fake trees) and returns an empty answer when its
source is missing or unreadable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from distlab import catalog

NVIDIA_VENDOR = "0x10de"


@dataclass(frozen=True)
class IBPort:
    """One port of an RDMA device: ``link_layer`` is InfiniBand, or Ethernet for RoCE."""
    port: int
    state: str
    rate: str
    link_layer: str


@dataclass(frozen=True)
class IBDevice:
    """One device under /sys/class/infiniband (an InfiniBand HCA or a RoCE NIC)."""
    name: str
    ports: list[IBPort]


@dataclass(frozen=True)
class PCIeLink:
    """The PCIe link of one NVIDIA device: negotiated speed and width, and the maximum of each."""
    address: str
    speed_gt_s: float | None
    width: int | None
    max_speed_gt_s: float | None
    max_width: int | None

    @property
    def generation(self) -> str | None:
        """Catalog name of the generation whose per-lane rate is the current speed, e.g. "PCIe 4.0"."""
        return pcie_generation(self.speed_gt_s)


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its CPUs (as the kernel's cpulist string) and memory."""
    node: int
    cpus: str
    memory_gib: float | None


def _read(path: Path, default: str = "unknown") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def read_infiniband(root: str | Path = "/sys/class/infiniband") -> list[IBDevice]:
    """Parse the RDMA devices in a /sys/class/infiniband tree (missing or unreadable: no devices)."""
    devices = []
    for dev in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
        numbered = [p for p in (dev / "ports").glob("*") if p.name.isdigit()]
        ports = [IBPort(int(p.name), _read(p / "state").split(":")[-1].strip(),  # state reads "4: ACTIVE"
                        _read(p / "rate"), _read(p / "link_layer")) for p in numbered]
        devices.append(IBDevice(dev.name, sorted(ports, key=lambda port: port.port)))
    return devices


def read_meminfo(path: str | Path = "/proc/meminfo") -> dict[str, float]:
    """MemTotal and MemAvailable in GiB from a meminfo file (empty where the file is absent)."""
    out: dict[str, float] = {}
    try:
        for line in Path(path).read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.split()[-1] if key.startswith("Node ") else key  # per-node files: "Node 0 MemTotal"
            if key in ("MemTotal", "MemAvailable") and value.split():
                out[key] = round(int(value.split()[0]) / 2**20, 2)  # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    return out


def read_numa(root: str | Path = "/sys/devices/system/node") -> list[NumaNode]:
    """NUMA nodes from /sys/devices/system/node/node*/ (absent: an empty list)."""
    nodes = []
    base = Path(root)
    for d in base.glob("node*") if base.is_dir() else []:
        if d.name[4:].isdigit():
            mem = read_meminfo(d / "meminfo").get("MemTotal")
            nodes.append(NumaNode(int(d.name[4:]), _read(d / "cpulist", "?"), mem))
    return sorted(nodes, key=lambda n: n.node)


def _speed(text: str) -> float | None:
    match = re.match(r"\s*([\d.]+)\s*GT/s", text)
    return float(match.group(1)) if match else None


def _width(text: str) -> int | None:
    match = re.match(r"\s*x?(\d+)", text)
    return int(match.group(1)) if match else None


def read_pcie_links(root: str | Path = "/sys/bus/pci/devices", vendor: str = NVIDIA_VENDOR) -> list[PCIeLink]:
    """Negotiated and maximum PCIe speed and width of every display/3D device of `vendor` (default NVIDIA),
    in PCI address order. Other devices of the vendor (NVSwitches are PCI bridges, class 0x06) are left
    out, so that entry i is GPU i when CUDA numbers GPUs in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    links = []
    base = Path(root)
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if _read(d / "vendor", "").lower() != vendor or not _read(d / "class", "0x03").startswith("0x03"):
            continue
        def get(name: str, d: Path = d) -> str:
            return _read(d / name, "")

        links.append(PCIeLink(d.name, _speed(get("current_link_speed")), _width(get("current_link_width")),
                              _speed(get("max_link_speed")), _width(get("max_link_width"))))
    return links


def pcie_generation(speed_gt_s: float | None) -> str | None:
    """Catalog generation for a per-lane speed in GT/s (2.5 -> "PCIe 1.0", 16 -> "PCIe 4.0"); None if none."""
    for gen in catalog.TABLES["pcie"]:
        if speed_gt_s is not None and abs(gen.gt_per_s - speed_gt_s) < 1e-6:
            return gen.name
    return None
