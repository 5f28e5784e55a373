"""Measure each path data takes, and set every result beside the catalog's figure for this hardware.

Paths, in the order of the book: host memory copy (CPU); host to device and device to host, from pinned
and from pageable memory (PCIe); device to device (HBM); GPU to GPU for every pair (NVLink or PCIe peer to
peer); and a collective's bus bandwidth across ranks, measured with Chapter 1's nccl-tests-style benchmark
(`distlab.collectives.bench`). Copies count bytes as NVIDIA's bandwidthTest does: the bytes moved, except
device to device, which reads and writes each byte and so counts it twice. A GPU path on a machine without
a GPU is skipped with a reason, never faked.

    python -m distlab.hardware --out assets/hardware/dgx-a100.json     # a lead with a GPU machine

writes the results and the hardware (GPU model, driver, CUDA, NCCL, torch) to a JSON file, with the
command that made it, so that reference measurements can be stored in assets/.
"""

from __future__ import annotations

import itertools
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from distlab import catalog, device_names
from distlab.hardware import probe
from distlab.hardware.probe import gpus as probe_gpus
from distlab.hardware.probe import host as probe_host
from distlab.timing import sample_seconds

NO_GPU_SKIP = "skipped: no CUDA GPU visible (torch.cuda.is_available() is False)"
GPU_TESTS = ("H2D pinned", "H2D pageable", "D2H pinned", "D2H pageable", "D2D", "P2P")


@dataclass(frozen=True)
class Result:
    """One measured path: GB/s measured (None if skipped), the spec it is compared with, and a note."""

    test: str
    measured_GBps: float | None
    spec_GBps: float | None
    spec: str
    note: str

    @property
    def percent_of_spec(self) -> float | None:
        if self.measured_GBps is None or not self.spec_GBps:
            return None
        return 100 * self.measured_GBps / self.spec_GBps


def format_results(results: Sequence[Result]) -> str:
    """Fixed-width table: test, measured GB/s, spec GB/s, % of spec, what the spec is, notes."""
    lines = [f"{'test':<22} {'GB/s':>9} {'spec GB/s':>10} {'% spec':>7}  spec / note"]
    for r in results:
        def num(x: float | None, width: int, digits: int, unit: str = "") -> str:
            return f"{'-':>{width}}" if x is None else f"{x:{width - len(unit)}.{digits}f}{unit}"

        lines.append(f"{r.test:<22} {num(r.measured_GBps, 9, 2)} {num(r.spec_GBps, 10, 2)} "
                     f"{num(r.percent_of_spec, 7, 0, '%')}  " + "; ".join(x for x in (r.spec, r.note) if x))
    return "\n".join(lines)


def _check(name: str, value: int, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}={value!r} must be an integer >= {least}, e.g. {name}={max(least, 4)}")
    return value


def _median_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None] | None) -> float:
    """One warm-up call (first-touch page faults, allocator, lazy CUDA context), then the middle of
    `repeats` timed calls (the upper one of the two for an even count: a measured time, not a mean)."""
    times = sorted(sample_seconds(fn, repeats, warmup=1, sync=sync))
    return times[len(times) // 2]


def host_copy(nbytes: int = 64 << 20, repeats: int = 5) -> Result:
    """Copy `nbytes` between two host buffers with ``Tensor.copy_``; GB/s of bytes copied (median)."""
    _check("nbytes", nbytes, 1)
    _check("repeats", repeats, 1)
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), repeats, None)
    return Result("host copy", nbytes / seconds / 1e9, None, "", f"{nbytes >> 20} MiB, median of {repeats}; "
                  "no catalog figure for host DRAM (each byte is read once and written once)")


# --------------------------------------------------------------------------------------------------
# GPU paths
# --------------------------------------------------------------------------------------------------

def _gpu_spec(index: int) -> Any:
    """The catalog row of CUDA device `index` (`device_names.gpu_for_device`), or None."""
    return device_names.gpu_for_device(torch.cuda.get_device_name(index))


def not_in_catalog(index: int = 0) -> str:
    """Why a result has no catalog figure: the device's name and the GPUs the catalog does hold."""
    return (f"{torch.cuda.get_device_name(index)} not in the catalog (it holds the SXM parts "
            f"{', '.join(catalog.names('gpu'))}; PCIe and NVL cards differ)")


def _link_of(index: int, links: Sequence[probe_host.PCIeLink]) -> probe_host.PCIeLink | None:
    """The sysfs PCIe link of CUDA device `index`, matched by PCI address where torch reports it (CUDA's
    default device order, fastest first, need not be PCI bus order); else entry `index` of `links`."""
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, int):
        domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        address = f"{domain:04x}:{bus:02x}:{device:02x}."
        return next((link for link in links if link.address.lower().startswith(address)), None)
    return links[index] if index < len(links) else None


def _pcie_spec(index: int, links: Sequence[probe_host.PCIeLink]) -> tuple[float | None, str]:
    """Per-direction GB/s of GPU `index`'s PCIe link: as negotiated (sysfs), else the GPU's generation x16."""
    link = _link_of(index, links)
    if link is not None and link.generation and link.width:
        gen = catalog.lookup("pcie", link.generation)
        return gen.link_GBps_per_direction(link.width), f"{link.generation} x{link.width}, per direction"
    gpu = _gpu_spec(index)
    if gpu is None:
        return None, not_in_catalog(index)
    if gpu.pcie is None:
        return None, f"{gpu.name}: no PCIe host link in the catalog ({gpu.note.split('; ')[-1]})"
    return catalog.lookup("pcie", gpu.pcie).link_GBps_per_direction(16), f"{gpu.pcie} x16, per direction"


def gpu_results(nbytes: int = 256 << 20, repeats: int = 5, links: Sequence[probe_host.PCIeLink] | None = None,
                topology: str | None = None) -> list[Result]:
    """H2D and D2H (pinned and pageable) and D2D on GPU 0, and P2P for every ordered pair of GPUs."""
    _check("nbytes", nbytes, 1)
    _check("repeats", repeats, 1)
    if not torch.cuda.is_available():
        return [Result(test, None, None, "", NO_GPU_SKIP) for test in GPU_TESTS]
    links = probe_host.read_pcie_links() if links is None else links
    matrix = probe_gpus.parse_topology(topology or probe_gpus.run_nvidia_smi(["topo", "-m"]) or "")
    dev = torch.device("cuda", 0)
    d = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    out = _host_copies(d, repeats, *_pcie_spec(0, links))
    out.append(_d2d(d, repeats))
    n = torch.cuda.device_count()
    for i, j in itertools.permutations(range(n), 2):
        out.append(_p2p(i, j, nbytes, repeats, matrix, links))
    if n < 2:
        out.append(Result("P2P", None, None, "", f"skipped: {n} GPU visible, peer to peer needs 2"))
    return out


def _host_copies(d: torch.Tensor, repeats: int, pcie: float | None, pcie_name: str) -> list[Result]:
    """H2D and D2H between GPU buffer `d` and a host buffer of its size, pinned then pageable."""
    nbytes, sync = d.numel(), torch.cuda.synchronize
    out = []
    for pinned in (True, False):
        h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        kind = "pinned" if pinned else "pageable"
        for name, fn in ((f"H2D {kind}", lambda h=h: d.copy_(h, non_blocking=True)),
                         (f"D2H {kind}", lambda h=h: h.copy_(d, non_blocking=True))):
            t = _median_seconds(fn, repeats, sync)
            out.append(Result(name, nbytes / t / 1e9, pcie, pcie_name, f"{nbytes >> 20} MiB, GPU 0"))
    return out


def _d2d(d: torch.Tensor, repeats: int) -> Result:
    """A copy inside GPU 0's memory, against its HBM bandwidth (each byte read and written)."""
    nbytes = d.numel()
    d2 = torch.empty_like(d)
    t = _median_seconds(lambda: d2.copy_(d), repeats, torch.cuda.synchronize)
    gpu = _gpu_spec(0)
    return Result("D2D", 2 * nbytes / t / 1e9, gpu.memory_GBps if gpu else None,
                  f"{gpu.name} HBM, reads + writes" if gpu else not_in_catalog(0),
                  "each byte read and written: counted twice")


def _p2p(i: int, j: int, nbytes: int, repeats: int, matrix: dict,
         links: Sequence[probe_host.PCIeLink]) -> Result:
    nv = probe_gpus.nvlinks_between(matrix, f"GPU{i}", f"GPU{j}")
    gpu = _gpu_spec(i)
    if nv and gpu:
        spec = nv * catalog.lookup("nvlink", gpu.nvlink).link_GBps_per_direction
        spec_name = f"{nv} x {gpu.nvlink}, per direction"
    elif matrix.get((f"GPU{i}", f"GPU{j}"), "").startswith("NV"):  # NVSwitch systems report NV# too
        spec = None
        spec_name = "NVLink: " + (not_in_catalog(i) if gpu is None else "link count not read from topo -m")
    else:
        spec, spec_name = _pcie_spec(i, links)
    if not torch.cuda.can_device_access_peer(i, j):
        return Result(f"P2P {i}->{j}", None, spec, spec_name, "skipped: no peer access between these GPUs")
    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}")
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{j}")

    def sync() -> None:
        torch.cuda.synchronize(i)
        torch.cuda.synchronize(j)

    t = _median_seconds(lambda: b.copy_(a, non_blocking=True), repeats, sync)
    return Result(f"P2P {i}->{j}", nbytes / t / 1e9, spec, spec_name, f"{nbytes >> 20} MiB")


# --------------------------------------------------------------------------------------------------
# Collective bus bandwidth (Chapter 1's benchmark) and the command line
# --------------------------------------------------------------------------------------------------

def collective(world_size: int = 2, size: str = "4M", repeats: int = 3, backend: str = "auto") -> Result:
    """all_reduce bus bandwidth of torch.distributed on `world_size` ranks, largest of the sizes."""
    from distlab.collectives import bench as ch1

    _check("world_size", world_size, 2)
    rows = ch1.benchmark(world_size, ["all_reduce"], size, ["torch"], repeats=repeats, backend=backend,
                         progress=False)
    best = max(rows, key=lambda r: r.busbw_GBps)
    on_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= world_size and backend != "gloo"
    gpu = _gpu_spec(0) if on_gpus else None
    spec = catalog.lookup("nvlink", gpu.nvlink).gpu_GBps_per_direction if gpu else None
    return Result(f"all_reduce busbw x{world_size}", best.busbw_GBps, spec,
                  f"{gpu.nvlink} per GPU, per direction" if gpu else "",
                  f"{best.size >> 20} MiB, " + ("NCCL" if on_gpus else "gloo, CPU: no catalog figure"))


def hardware_info() -> dict[str, Any]:
    """What these results were measured on: GPU model, driver, CUDA, NCCL, torch, Python, OS."""
    p = probe.probe()
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    return {"gpus": [g.name for g in p.gpus], "driver": p.driver, "cuda": torch.version.cuda, "nccl": nccl,
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}",
            "pcie": [asdict(k) for k in p.pcie], "infiniband": [asdict(d) for d in p.infiniband]}


def run_all(nbytes: int = 256 << 20, repeats: int = 5, world_size: int = 2, size: str = "4M") -> list[Result]:
    """Every path: host copy, the GPU paths (or their skip notes), and the collective."""
    return [host_copy(min(nbytes, 256 << 20), repeats), *gpu_results(nbytes, repeats),
            collective(world_size, size)]
