"""What this machine has: GPUs and how they are wired, PCIe links, RDMA ports, NUMA nodes, memory.

Every probe is guarded: a laptop with no GPU, no nvidia-smi, no InfiniBand and no /sys still gets a full
`Probe`, which says plainly what is absent. The file-system roots (`sys_root`, `proc_root`), the
nvidia-smi runner (`smi`) and the NVML module (`nvml`) are parameters, so tests feed fake trees and fake
command output. `distlab doctor` reads the same functions.

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

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from distlab.hardware import catalog

SmiRunner = Callable[[Sequence[str]], "str | None"]
NVIDIA_VENDOR = "0x10de"
NO_GPU_PROBE = "No NVIDIA GPU found (no NVML, no nvidia-smi, no NVIDIA PCIe device): GPU probes skipped."


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


@dataclass(frozen=True)
class GPUInfo:
    """One GPU as NVML or nvidia-smi names it, and its active NVLinks."""
    index: int
    name: str
    nvlinks_active: int | None


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


# --------------------------------------------------------------------------------------------------
# Runners and readers (each returns an empty answer when its source is absent)
# --------------------------------------------------------------------------------------------------

def run_nvidia_smi(args: Sequence[str], executable: str = "nvidia-smi", timeout: float = 5.0) -> str | None:
    """Output of ``nvidia-smi *args``, or None when it is absent, fails or takes longer than ``timeout`` s."""
    path = shutil.which(executable)
    if path is None:
        return None
    try:
        done = subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout.strip()
    return text if done.returncode == 0 and text else None


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


def parse_topology(text: str) -> dict[tuple[str, str], str]:
    """``nvidia-smi topo -m`` as {(row, column): label}, e.g. {("GPU0", "GPU1"): "NV12"}; legend ignored."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = [h for h in re.split(r"\t+|\s{2,}", lines[0].strip()) if h]
    devices = [h for h in header if re.fullmatch(r"(GPU|NIC|mlx)\S*", h)]
    out = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("\t")] if "\t" in line else line.split()
        cells = [c for c in cells if c != ""]
        if not cells or cells[0] not in devices:
            continue
        for col, label in zip(devices, cells[1:1 + len(devices)], strict=False):
            out[(cells[0], col)] = label
    return out


def nvlinks_between(topology: dict[tuple[str, str], str], a: str, b: str) -> int:
    """Number of NVLinks between devices a and b in a parsed topology ("NV12" -> 12; anything else 0)."""
    match = re.fullmatch(r"NV(\d+)", topology.get((a, b), ""))
    return int(match.group(1)) if match else 0


def summarize_nvlink(status: str) -> list[str]:
    """One line per GPU from ``nvidia-smi nvlink --status``: how many links are up and at what speed."""
    gpus: list[tuple[str, list[str], int]] = []
    for line in status.splitlines():
        if line.startswith("GPU "):
            gpus.append((line.split("(UUID")[0].strip(), [], 0))
        elif gpus and re.search(r"Link \d+:", line):
            speed = re.search(r"Link \d+:\s*([\d.]+\s*GB/s)", line)
            name, up, down = gpus[-1]
            gpus[-1] = (name, up + [speed.group(1)] if speed else up, down + (0 if speed else 1))
    return [f"{name}: {len(up)} link(s) up" + (f" at {up[0]} each" if up and len(set(up)) == 1 else "")
            + (f", {down} inactive" if down else "") for name, up, down in gpus] or status.splitlines()


def _nvlink_counts(status: str | None) -> list[int]:
    counts: list[int] = []
    for line in (status or "").splitlines():
        if line.startswith("GPU "):
            counts.append(0)
        elif counts and re.search(r"Link \d+:\s*[\d.]+\s*GB/s", line):
            counts[-1] += 1
    return counts


def load_nvml() -> ModuleType | None:
    """The ``pynvml`` module, initialised, or None when it is not installed or finds no driver."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - not installed, no driver, no GPU: all mean "no NVML"
        return None


def nvml_gpus(nvml: ModuleType) -> tuple[list[GPUInfo], str | None]:
    """GPUs, active NVLinks per GPU and the driver version from NVML."""
    gpus = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        name = nvml.nvmlDeviceGetName(handle)
        active = 0
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                active += int(nvml.nvmlDeviceGetNvLinkState(handle, link) == 1)
            except Exception:  # noqa: BLE001 - NVML raises for links a GPU does not have
                break
        gpus.append(GPUInfo(i, name.decode() if isinstance(name, bytes) else str(name), active))
    driver = nvml.nvmlSystemGetDriverVersion()
    return gpus, driver.decode() if isinstance(driver, bytes) else str(driver)


def smi_gpus(smi: SmiRunner, nvlink_status: str | None) -> tuple[list[GPUInfo], str | None]:
    """GPUs and the driver version from ``nvidia-smi --query-gpu`` (empty when nvidia-smi is absent)."""
    text = smi(["--query-gpu=index,name,driver_version", "--format=csv,noheader"])
    counts = _nvlink_counts(nvlink_status)
    gpus, driver = [], None
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            i = int(parts[0])
            gpus.append(GPUInfo(i, parts[1], counts[i] if i < len(counts) else None))
            driver = parts[2]
    return gpus, driver


# --------------------------------------------------------------------------------------------------
# The whole probe
# --------------------------------------------------------------------------------------------------

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
        except Exception:  # noqa: BLE001 - a broken NVML falls back to nvidia-smi
            gpus = []
    if not gpus:
        gpus, driver = smi_gpus(smi, nvlink)
        source = "nvidia-smi" if gpus else None
    return Probe(gpus=gpus, gpu_source=source, driver=driver, topology=smi(["topo", "-m"]), nvlink=nvlink,
                 pcie=read_pcie_links(sys_root / "bus" / "pci" / "devices"),
                 infiniband=read_infiniband(sys_root / "class" / "infiniband"),
                 numa=read_numa(sys_root / "devices" / "system" / "node"),
                 memory=read_meminfo(Path(proc_root) / "meminfo"))


def gpu_model(name: str) -> str | None:
    """Catalog GPU for a device name ("NVIDIA A100-SXM4-80GB" -> "A100"); None when the catalog has none."""
    for row in catalog.TABLES["gpu"]:
        if re.search(rf"\b{row.name}\b", name, re.IGNORECASE):
            return row.name
    return None


def render(p: Probe) -> str:
    """Plain-text view of a probe, one section per topic."""
    lines = ["GPUs" + (f" (from {p.gpu_source}; driver {p.driver or '?'}):" if p.gpus else ":")]
    lines += [f"  GPU{g.index}: {g.name}" + (f", {g.nvlinks_active} NVLink(s) active"
                                              if g.nvlinks_active is not None else "") for g in p.gpus]
    if not p.gpus:
        lines.append("  " + NO_GPU_PROBE)
    lines.append("PCIe links of NVIDIA devices (sysfs):")
    lines += [f"  {k.address}: {k.speed_gt_s or '?'} GT/s x{k.width or '?'} ({k.generation or 'unknown'}; "
              f"max {k.max_speed_gt_s or '?'} GT/s x{k.max_width or '?'})" for k in p.pcie] or ["  none"]
    lines.append("InfiniBand / RoCE ports (sysfs):")
    lines += [f"  {d.name} port {q.port}: {q.state}, {q.rate}, {q.link_layer}" for d in p.infiniband
              for q in d.ports] or ["  none (multi-node traffic would use TCP sockets)"]
    lines.append("NUMA nodes:")
    lines += [f"  node{n.node}: CPUs {n.cpus}" + (f", {n.memory_gib:.1f} GiB" if n.memory_gib else "")
              for n in p.numa] or ["  none reported"]
    if p.memory:
        lines.append(f"Memory: {p.memory.get('MemTotal', 0):.1f} GiB total")
    return "\n".join(lines)
