"""`distlab doctor`: what this machine offers the labs, and what the labs will use.

Call :func:`report` for the facts as a :class:`Report`, or :func:`print_report` to show them. Every probe is
guarded: a machine without a GPU, nvidia-smi, InfiniBand or /proc still gets a full report. The file-system
roots and the nvidia-smi runner are parameters, so that tests can feed fake trees and fake output. The
probes of the hardware itself (nvidia-smi, NVLink, /sys/class/infiniband, meminfo) are those of
`distlab.hardware.probe`, re-exported here.

NCCL shows up three times, and they can disagree: the version torch was compiled against
(``torch.cuda.nccl.version()`` reads NCCL's headers at build time), the ``nvidia-nccl-cu12`` pip package,
and the ``libnccl`` torch actually loaded (found in /proc/self/maps and asked ``ncclGetVersion`` at run
time). When NCCL misbehaves, a mismatch between these is the first thing to rule out, so it is flagged.

The network variables that are set (NCCL_*, TORCH_NCCL_*, GLOO_SOCKET_IFNAME, MASTER_ADDR, ...) are listed
with one line on what each does (`distlab.doctor_network`), or one line saying none is set.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib.metadata
import json
import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from distlab import catalog, device_names
from distlab.doctor_network import describe as describe_network
from distlab.doctor_network import network_env

# the machine probes are chapter 8's (distlab.hardware.probe.gpus and distlab.hardware.probe.host)
from distlab.hardware.probe.gpus import SmiRunner, run_nvidia_smi, summarize_nvlink
from distlab.hardware.probe.host import IBDevice, read_infiniband, read_meminfo

NCCL_PIP_PACKAGES = ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11")
CPU_WORLD_SIZES = (2, 4)
NO_GPU = "No CUDA GPU visible: the labs run ranks as CPU processes on the gloo backend."
NO_RDMA = "No InfiniBand / RDMA device: traffic between machines would go over TCP sockets."


@dataclass(frozen=True)
class GPU:
    """One CUDA device as torch sees it."""
    index: int
    name: str
    memory_gib: float
    compute_capability: str
    multiprocessors: int

    @property
    def spec(self) -> str:
        """The catalog's figures for this device (`distlab.device_names`), or why there are none."""
        row = device_names.gpu_for_device(self.name)
        held = ", ".join(catalog.names("gpu"))
        return (device_names.describe(row) if row
                else f"not in distlab.catalog (it holds {held}; PCIe and NVL cards differ)")


@dataclass(frozen=True)
class LabRun:
    """How ``launch.run(fn, world_size, backend="auto")`` will run on this machine."""
    world_size: int
    backend: str
    note: str


@dataclass
class Report:
    """Everything `distlab doctor` found. ``str(report)`` is the plain-text view, ``to_json()`` the JSON."""
    python: str
    platform: str
    torch: str | None
    cuda_available: bool
    cuda_version: str | None
    cudnn_version: int | None
    nccl_torch: str | None
    nccl_loaded_path: str | None
    nccl_loaded_version: str | None
    nccl_pip: dict[str, str]
    backends: dict[str, bool]
    cpu_count: int | None
    cpu_affinity: int | None
    memory_total_gib: float | None
    memory_available_gib: float | None
    gpus: list[GPU]
    topology: str | None
    nvlink: str | None
    infiniband: list[IBDevice]
    lab_runs: list[LabRun]
    warnings: list[str] = field(default_factory=list)
    network_env: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The report as plain data (nested dataclasses become dicts)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The report as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        return render(self)

    def _repr_markdown_(self) -> str:
        return "```text\n" + render(self) + "\n```"


def find_loaded_nccl(maps: str | os.PathLike = "/proc/self/maps") -> str | None:
    """Path of the libnccl mapped into this process (Linux), or None."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return None
    paths = {parts[5] for parts in (line.split(maxsplit=5) for line in text.splitlines()) if len(parts) == 6}
    hits = sorted(p for p in paths if re.search(r"/libnccl\.so(\.\d+)*$", p))  # not plugins (libnccl-net)
    return hits[0] if hits else None


def decode_nccl_version(code: int) -> str:
    """Turn ``ncclGetVersion``'s integer into "major.minor.patch" (the encoding changed at NCCL 2.9)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def nccl_library_version(path: str) -> str | None:
    """Ask the library at ``path`` for its version through ``ncclGetVersion``; None if that fails."""
    try:
        code = ctypes.c_int(0)
        if ctypes.CDLL(path).ncclGetVersion(ctypes.byref(code)) != 0:
            return None
        return decode_nccl_version(code.value)
    except (OSError, AttributeError):
        return None


def _same_version(a: str, b: str) -> bool:
    """Compare major.minor.patch only (pip may add ``.post1``, torch a suffix)."""
    return re.findall(r"\d+", a)[:3] == re.findall(r"\d+", b)[:3]


def nccl_warnings(torch_nccl: str | None, loaded: str | None, pip: dict[str, str],
                  loaded_path: str | None = None) -> list[str]:
    """Warnings for every pair of known NCCL versions that disagree (none when versions are unknown)."""
    out = []
    for package, version in pip.items():
        out += _pip_nccl_warnings(package, version, torch_nccl, loaded, loaded_path)
    said = any(_same_version(loaded, v) for v in pip.values()) if loaded else False  # covered above
    if torch_nccl and loaded and not _same_version(torch_nccl, loaded) and not said:
        out.append(f"NCCL mismatch: torch was built against NCCL {torch_nccl} but loaded {loaded} "
                   f"from {loaded_path or 'an unknown path'}.")
    return out


def _pip_nccl_warnings(package: str, version: str, torch_nccl: str | None, loaded: str | None,
                       loaded_path: str | None) -> list[str]:
    """Where one pip NCCL package disagrees with the NCCL torch was built against or the one it loaded."""
    out = []
    if torch_nccl and not _same_version(torch_nccl, version):
        out.append(f"NCCL mismatch: torch was built against NCCL {torch_nccl}, but the pip package "
                   f"{package} is {version}. Install the {package} version torch expects "
                   f"(`pip install {package}=={torch_nccl}`) or a torch built for {version}.")
    if loaded and not _same_version(loaded, version):
        out.append(f"NCCL mismatch: torch loaded NCCL {loaded} from {loaded_path or 'an unknown path'}, "
                   f"not the pip package {package} {version}; check LD_LIBRARY_PATH and LD_PRELOAD.")
    return out


def plan_lab_runs(n_gpus: int, cpu_cores: int, nccl_available: bool = True) -> list[LabRun]:
    """The world sizes the labs use and the backend ``launch.run(..., backend="auto")`` picks for each.

    The launcher's rule (``launch.choose_backend``): NCCL with one GPU per rank when torch has NCCL and at
    least ``world_size`` CUDA GPUs are visible, otherwise gloo with every rank a CPU process. The labs use
    2 and 4 ranks, and on GPUs powers of two up to the GPU count, and the GPU count itself.
    """
    from distlab.launch import choose_backend  # here, not at the top: doctor must run even if torch is broken

    sizes = set(CPU_WORLD_SIZES) | ({n_gpus} if n_gpus else set())
    sizes |= {2**k for k in range(1, 8) if 2**k <= n_gpus}
    runs = []
    for size in sorted(sizes):
        if choose_backend(size, n_gpus, nccl_available) == "nccl":
            runs.append(LabRun(size, "nccl", f"one GPU per rank (cuda:0..cuda:{size - 1})"))
        elif size <= cpu_cores:
            runs.append(LabRun(size, "gloo", "CPU processes, one core each"))
        else:
            runs.append(LabRun(size, "gloo", f"CPU processes sharing {cpu_cores} core(s): timings are "
                                             "contended, so compare algorithms, not absolute numbers"))
    return runs


def _torch_facts() -> dict:
    """Versions, backends and GPUs from torch; each probe guarded so one failure hides only its own fact."""
    facts: dict = {"torch": None, "cuda_available": False, "cuda_version": None, "cudnn_version": None,
                   "nccl_torch": None, "backends": {}, "gpus": [], "warnings": []}
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:
        facts["warnings"].append(f"torch could not be imported ({exc}); the labs need it.")
        return facts
    facts["torch"] = torch.__version__
    facts["cuda_version"] = torch.version.cuda
    try:
        facts["cuda_available"] = bool(torch.cuda.is_available())
        if torch.backends.cudnn.is_available():
            facts["cudnn_version"] = torch.backends.cudnn.version()
        if hasattr(torch._C, "_nccl_version"):  # a CUDA build knows its NCCL even when no GPU is visible
            facts["nccl_torch"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        if facts["cuda_available"]:
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                facts["gpus"].append(GPU(i, p.name, round(p.total_memory / 2**30, 1), f"{p.major}.{p.minor}",
                                         p.multi_processor_count))
    except Exception as exc:
        facts["warnings"].append(f"CUDA probe failed: {exc}")
    ok = dist.is_available()
    facts["backends"] = {"gloo": ok and dist.is_gloo_available(), "nccl": ok and dist.is_nccl_available(),
                         "mpi": ok and dist.is_mpi_available()}
    return facts


def report(sys_root: str | os.PathLike = "/sys", proc_root: str | os.PathLike = "/proc",
           smi: SmiRunner = run_nvidia_smi, environ: Mapping[str, str] | None = None) -> Report:
    """Probe this machine. ``sys_root``, ``proc_root``, ``smi`` and ``environ`` are injectable for tests."""
    facts = _torch_facts()  # imports torch (and so libnccl, if it has one) before /proc/self/maps is read
    loaded_path = find_loaded_nccl(Path(proc_root) / "self" / "maps")
    loaded = nccl_library_version(loaded_path) if loaded_path else None
    pip = {}
    for package in NCCL_PIP_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            pip[package] = importlib.metadata.version(package)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = affinity or os.cpu_count() or 1
    mem = read_meminfo(Path(proc_root) / "meminfo")
    topology = smi(["topo", "-m"])
    return Report(
        python=platform.python_version(), platform=f"{platform.system()} {platform.machine()}",
        torch=facts["torch"], cuda_available=facts["cuda_available"], cuda_version=facts["cuda_version"],
        cudnn_version=facts["cudnn_version"], nccl_torch=facts["nccl_torch"], nccl_loaded_path=loaded_path,
        nccl_loaded_version=loaded, nccl_pip=pip, backends=facts["backends"], cpu_count=os.cpu_count(),
        cpu_affinity=affinity, memory_total_gib=mem.get("MemTotal"),
        memory_available_gib=mem.get("MemAvailable"),
        gpus=facts["gpus"], topology=topology, nvlink=smi(["nvlink", "--status"]),
        infiniband=read_infiniband(Path(sys_root) / "class" / "infiniband"),
        lab_runs=plan_lab_runs(len(facts["gpus"]), cores, facts["backends"].get("nccl", False)),
        warnings=facts["warnings"] + nccl_warnings(facts["nccl_torch"], loaded, pip, loaded_path),
        network_env=network_env(os.environ if environ is None else environ),
    )


def _versions(r: Report) -> list[str]:
    """Python, torch and what torch was built for; words, not placeholders, for what is missing."""
    if r.torch is None:
        return [f"Python {r.python} on {r.platform}", "torch: not installed (the labs need it)"]
    build = (f"built for CUDA {r.cuda_version}, cuDNN {r.cudnn_version or 'not available'}"
             if r.cuda_version else "CPU-only build")
    return [f"Python {r.python} on {r.platform}",
            f"torch {r.torch} ({build}); CUDA GPU usable: {'yes' if r.cuda_available else 'no'}"]


def _nccl(r: Report) -> list[str]:
    """The three views of NCCL, or one line when this torch has none and none is installed."""
    if not (r.nccl_torch or r.nccl_loaded_version or r.nccl_pip):
        return ["NCCL: not part of this torch build and not installed; the labs use gloo"]
    loaded = (f"{r.nccl_loaded_version} ({r.nccl_loaded_path})" if r.nccl_loaded_version
              else "none loaded (torch loads NCCL once a GPU job starts)")
    return [f"NCCL torch was built against: {r.nccl_torch or 'none (no NCCL in this torch build)'}",
            f"NCCL library torch loaded:    {loaded}",
            "NCCL pip package:             "
            + (", ".join(f"{k} {v}" for k, v in r.nccl_pip.items()) or "not installed")]


def _gpus(r: Report) -> list[str]:
    """The GPUs and their interconnect, or one line when there is no GPU and no nvidia-smi output."""
    if not (r.gpus or r.topology or r.nvlink):
        return [NO_GPU]
    lines = [f"GPUs ({len(r.gpus)}):" if r.gpus else NO_GPU]
    lines += [f"  cuda:{g.index}  {g.name}  {g.memory_gib:.1f} GiB  compute capability "
              f"{g.compute_capability}  {g.multiprocessors} SMs\n    catalog: {g.spec}" for g in r.gpus]
    lines += ["", "GPU interconnect (nvidia-smi topo -m):"] + (
        ["  " + row for row in r.topology.splitlines()] if r.topology
        else ["  not available (nvidia-smi did not answer)"])
    if r.nvlink:
        lines += ["NVLink (nvidia-smi nvlink --status):"] + ["  " + row for row in summarize_nvlink(r.nvlink)]
    return lines


def _infiniband(r: Report) -> list[str]:
    """RDMA ports, or one line when there is none."""
    if not r.infiniband:
        return [NO_RDMA]
    return ["InfiniBand / RDMA devices (/sys/class/infiniband):"] + [
        f"  {d.name} port {p.port}: {p.state}, {p.rate}, {p.link_layer}"
        + (" (RoCE: RDMA over Ethernet)" if p.link_layer == "Ethernet" else "")
        for d in r.infiniband for p in d.ports]


def render(r: Report) -> str:
    """Plain-text report, one section per topic, warnings last. A section with nothing to show (no GPU,
    no RDMA port, no NCCL) is one line that says so."""
    def gib(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.1f} GiB"

    usable = "unknown" if r.cpu_affinity is None else r.cpu_affinity
    lines = ["distlab doctor", "==============", *_versions(r), "",
             "Communication backends (torch.distributed): "
             + (", ".join(f"{k} {'yes' if v else 'no'}" for k, v in r.backends.items()) or "none"),
             *_nccl(r), "",
             f"CPU cores: {r.cpu_count} ({usable} usable by this process)",
             f"Memory: {gib(r.memory_total_gib)} total, {gib(r.memory_available_gib)} available", "",
             *_gpus(r), "", *_infiniband(r), "", *describe_network(r.network_env), "",
             "What the labs will use here (launch.run with backend=\"auto\"):"]
    lines += [f"  world_size {run.world_size}: {run.backend}, {run.note}" for run in r.lab_runs]
    if r.warnings:
        lines += ["", "WARNINGS:"] + [f"  ! {w}" for w in r.warnings]
    return "\n".join(lines)


def print_report(**kwargs: object) -> Report:
    """Probe (``kwargs`` go to :func:`report`), print the text view, and return the report."""
    result = report(**kwargs)  # type: ignore[arg-type]
    print(result)
    return result
