"""What this machine's GPUs are and how they are wired: NVML or nvidia-smi, NVLinks, `nvidia-smi topo -m`.

GPUs and their NVLink state come from NVML through ``pynvml`` when it imports, else from ``nvidia-smi``;
the GPU/NIC interconnect matrix from ``nvidia-smi topo -m`` (NV# = # NVLinks, PIX/PXB = through PCIe
switches, NODE = within a NUMA node, SYS = across the CPU interconnect). The nvidia-smi runner and the
NVML module are parameters, so tests feed fake output; with no GPU every reader returns an empty answer.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

from distlab import device_names

SmiRunner = Callable[[Sequence[str]], "str | None"]
NO_GPU_PROBE = "No NVIDIA GPU found (no NVML, no nvidia-smi, no NVIDIA PCIe device): GPU probes skipped."


@dataclass(frozen=True)
class GPUInfo:
    """One GPU as NVML or nvidia-smi names it, and its active NVLinks."""
    index: int
    name: str
    nvlinks_active: int | None


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


def parse_topology(text: str) -> dict[tuple[str, str], str]:
    """``nvidia-smi topo -m`` as {(row, column): label}, e.g. {("GPU0", "GPU1"): "NV12"}; legend ignored."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = [h for h in re.split(r"\t+|\s{2,}", lines[0].strip()) if h]
    devices = [h for h in header if re.fullmatch(r"(GPU|NIC|mlx)\S*", h)]
    out = {}
    for cells in map(_cells, lines[1:]):
        if cells and cells[0] in devices:
            out.update({(cells[0], col): label
                        for col, label in zip(devices, cells[1:1 + len(devices)], strict=False)})
    return out


def _cells(line: str) -> list[str]:
    """One row of the matrix: tab-separated when nvidia-smi wrote tabs, else split on spaces."""
    cells = [c.strip() for c in line.split("\t")] if "\t" in line else line.split()
    return [c for c in cells if c != ""]


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
    except Exception:  # not installed, no driver, no GPU: all mean "no NVML"
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
            except Exception:  # NVML raises for links a GPU does not have
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


def gpu_model(name: str) -> str | None:
    """Catalog GPU for a device name ("NVIDIA A100-SXM4-80GB" -> "A100", "NVIDIA H200" -> "H200"); None when
    the catalog has none (`distlab.device_names.gpu_for_device`, which says how names are matched)."""
    row = device_names.gpu_for_device(name)
    return None if row is None else row.name
