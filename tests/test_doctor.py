"""Tests for `distlab doctor`: the report on this machine, the CLI, and each parser on fake inputs."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from distlab import cli, doctor, launch
from distlab.hardware.probe import host as probe_host

TOPO = """\
\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\tPXB\t0-63\t0
GPU1\tNV18\t X \tPXB\t0-63\t0
NIC0\tPXB\tPXB\t X \t\t"""

NVLINK = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)
\t Link 0: 26.562 GB/s
\t Link 1: 26.562 GB/s
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)
\t Link 0: 26.562 GB/s
\t Link 1: <inactive>"""


def no_smi(args: object) -> None:
    """An nvidia-smi runner for a machine without nvidia-smi."""
    return None


def fake_smi(args: list[str]) -> str | None:
    """An nvidia-smi runner that answers like a two-GPU NVLink node."""
    return {"topo": TOPO, "nvlink": NVLINK}.get(args[0])


def write_port(root: Path, device: str, port: int, state: str, rate: str, link_layer: str) -> None:
    """Lay out one port the way the kernel does under /sys/class/infiniband."""
    d = root / "class" / "infiniband" / device / "ports" / str(port)
    d.mkdir(parents=True)
    for name, text in (("state", state), ("rate", rate), ("link_layer", link_layer)):
        (d / name).write_text(text + "\n")


@pytest.fixture(scope="module")
def here() -> doctor.Report:
    """The real report of this machine (probed once for the module)."""
    return doctor.report()


def test_report_on_this_machine(here: doctor.Report) -> None:
    assert here.python.count(".") == 2 and here.torch == torch.__version__
    assert here.backends["gloo"] is True
    assert here.cpu_count and here.cpu_count >= 1
    text = str(here)
    for section in ("NCCL", "CPU cores", "InfiniBand", "What the labs will use"):
        assert section in text, f"section {section!r} missing from:\n{text}"
    assert not re.search(r"(?<![\w-])-(?![\w-])", text), f"a dash stands in for a missing fact:\n{text}"
    if not torch.cuda.is_available():
        assert here.gpus == [] and not here.cuda_available
        assert doctor.NO_GPU in text
        assert [(r.world_size, r.backend) for r in here.lab_runs] == [(2, "gloo"), (4, "gloo")]
    for run in here.lab_runs:  # the doctor's rule is the launcher's rule
        assert run.backend == launch.resolve_backend("auto", run.world_size), run


def test_cli_console_script_and_json() -> None:
    script = Path(sys.executable).with_name("distlab")
    assert script.exists(), f"{script} missing: run `pip install -e .` to create the console script"
    commands = [[str(script), "doctor"], [sys.executable, "-m", "distlab.cli", "doctor", "--json"]]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    (text, err_text), (out, err_json) = (p.communicate(timeout=60) for p in procs)
    assert [p.returncode for p in procs] == [0, 0], err_text + err_json
    assert text.startswith("distlab doctor") and "What the labs will use here" in text
    data = json.loads(out)
    assert data["backends"]["gloo"] is True and isinstance(data["lab_runs"], list)
    assert {"world_size", "backend", "note"} <= set(data["lab_runs"][0])


def test_cli_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor", "--json"]) == 0
    assert "cpu_count" in json.loads(capsys.readouterr().out)
    assert cli.main([]) == 0  # `distlab` alone lists the commands (issue 38, D12), it is not an error
    assert "COMMAND" in capsys.readouterr().out


def test_cli_figures_is_wired_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    fake = types.ModuleType("distlab.figures")
    fake.main = lambda argv: calls.append(list(argv))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "distlab.figures", fake)
    assert cli.main(["figures", "book/figures"]) == 0
    assert calls == [["book/figures"]]


def test_infiniband_tree(tmp_path: Path) -> None:
    write_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand")
    write_port(tmp_path, "mlx5_1", 10, "1: DOWN", "100 Gb/sec (4X EDR)", "Ethernet")
    write_port(tmp_path, "mlx5_1", 2, "4: ACTIVE", "200 Gb/sec (4X HDR)", "Ethernet")
    devices = doctor.read_infiniband(tmp_path / "class" / "infiniband")
    assert [d.name for d in devices] == ["mlx5_0", "mlx5_1"]
    assert devices[0].ports == [probe_host.IBPort(1, "ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand")]
    assert [(p.port, p.state, p.link_layer) for p in devices[1].ports] == [(2, "ACTIVE", "Ethernet"),
                                                                          (10, "DOWN", "Ethernet")]
    text = str(doctor.report(sys_root=tmp_path, smi=no_smi))
    assert "mlx5_0 port 1: ACTIVE, 400 Gb/sec (4X NDR), InfiniBand" in text
    assert "mlx5_1 port 2: ACTIVE, 200 Gb/sec (4X HDR), Ethernet (RoCE" in text
    assert doctor.read_infiniband(tmp_path / "nowhere") == []


def test_nccl_mismatch_warnings() -> None:
    assert doctor.nccl_warnings("2.21.5", "2.21.5", {"nvidia-nccl-cu12": "2.21.5"}) == []
    assert doctor.nccl_warnings("2.26.2", None, {"nvidia-nccl-cu12": "2.26.2.post1"}) == []
    assert doctor.nccl_warnings(None, None, {}) == []
    [w] = doctor.nccl_warnings("2.21.5", None, {"nvidia-nccl-cu12": "2.26.2"})
    assert "built against NCCL 2.21.5" in w and "nvidia-nccl-cu12 is 2.26.2" in w
    assert "pip install nvidia-nccl-cu12==2.21.5" in w
    [w] = doctor.nccl_warnings(None, "2.19.3", {"nvidia-nccl-cu12": "2.21.5"}, "/opt/nccl/lib/libnccl.so.2")
    assert "loaded NCCL 2.19.3 from /opt/nccl/lib/libnccl.so.2" in w and "2.21.5" in w
    [w] = doctor.nccl_warnings("2.21.5", "2.19.3", {}, "/usr/lib/libnccl.so.2")
    assert "built against NCCL 2.21.5 but loaded 2.19.3 from /usr/lib/libnccl.so.2" in w
    # pip and the loaded copy agree with each other but not with torch's headers: two facts, two warnings
    assert len(doctor.nccl_warnings("2.21.5", "2.26.2", {"nvidia-nccl-cu12": "2.26.2"})) == 1
    assert doctor.decode_nccl_version(22105) == "2.21.5" and doctor.decode_nccl_version(2708) == "2.7.8"


def test_a_laptop_gets_words_and_one_line_per_empty_section(here: doctor.Report) -> None:
    laptop = dataclasses.replace(
        here, torch="2.13.0+cpu", cuda_available=False, cuda_version=None, cudnn_version=None,
        nccl_torch=None, nccl_loaded_path=None, nccl_loaded_version=None, nccl_pip={}, gpus=[], topology=None,
        nvlink=None, infiniband=[], warnings=[])
    text = str(laptop)
    assert "torch 2.13.0+cpu (CPU-only build); CUDA GPU usable: no" in text
    assert "NCCL: not part of this torch build and not installed; the labs use gloo" in text
    assert f"\n{doctor.NO_GPU}\n" in text and f"\n{doctor.NO_RDMA}\n" in text
    for absent in ("GPU interconnect", "NVLink", "/sys/class/infiniband", "GPUs (", " - ", "(-"):
        assert absent not in text, f"{absent!r} should not appear on a laptop:\n{text}"
    missing = dataclasses.replace(laptop, torch=None, backends={})
    assert "torch: not installed (the labs need it)" in str(missing)
    cuda = dataclasses.replace(laptop, torch="2.13.0", cuda_version="12.8", cudnn_version=91000,
                               nccl_torch="2.27.5", nccl_pip={"nvidia-nccl-cu12": "2.27.5"})
    text = str(cuda)
    assert "torch 2.13.0 (built for CUDA 12.8, cuDNN 91000); CUDA GPU usable: no" in text
    assert "NCCL torch was built against: 2.27.5" in text
    assert "NCCL library torch loaded:    none loaded" in text and "nvidia-nccl-cu12 2.27.5" in text


def test_warnings_reach_the_text(here: doctor.Report) -> None:
    r = dataclasses.replace(here, warnings=["NCCL mismatch: example"])
    assert "WARNINGS:\n  ! NCCL mismatch: example" in str(r)


def test_find_loaded_nccl(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /site-packages/nvidia/nccl/lib/libnccl-net.so\n"
        "7f01-7f02 r-xp 00000000 08:01 2 /site-packages/nvidia/nccl/lib/libnccl.so.2\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n")
    assert doctor.find_loaded_nccl(maps) == "/site-packages/nvidia/nccl/lib/libnccl.so.2"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n")
    assert doctor.find_loaded_nccl(maps) is None
    assert doctor.find_loaded_nccl(tmp_path / "absent") is None
    assert doctor.nccl_library_version(str(tmp_path / "absent.so")) is None


def test_meminfo(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:  16777216 kB\nMemFree: 1 kB\nMemAvailable:  8388608 kB\n")
    assert doctor.read_meminfo(tmp_path / "meminfo") == {"MemTotal": 16.0, "MemAvailable": 8.0}
    assert doctor.read_meminfo(tmp_path / "absent") == {}
    r = doctor.report(proc_root=tmp_path, smi=no_smi)
    assert r.memory_total_gib == 16.0 and "Memory: 16.0 GiB total, 8.0 GiB available" in str(r)


def test_nvidia_smi_absent_failing_or_slow(tmp_path: Path) -> None:
    assert doctor.run_nvidia_smi(["topo", "-m"], executable="no-such-nvidia-smi-here") is None
    for name, body in (("ok", "echo matrix"), ("fails", "echo oops; exit 9"), ("slow", "sleep 5")):
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    assert doctor.run_nvidia_smi([], executable=str(tmp_path / "ok")) == "matrix"
    assert doctor.run_nvidia_smi([], executable=str(tmp_path / "fails")) is None
    assert doctor.run_nvidia_smi([], executable=str(tmp_path / "slow"), timeout=0.3) is None
    here = doctor.report(smi=no_smi)
    assert "NVLink" not in str(here)
    with_gpu = dataclasses.replace(here, gpus=[doctor.GPU(0, "NVIDIA H100 80GB HBM3", 79.1, "9.0", 132)])
    assert ("GPU interconnect (nvidia-smi topo -m):\n  not available (nvidia-smi did not answer)"
            in str(with_gpu))


def test_fake_nvidia_smi_output(here: doctor.Report) -> None:
    gpu = doctor.GPU(0, "NVIDIA H100 80GB HBM3", 79.1, "9.0", 132)
    r = dataclasses.replace(here, gpus=[gpu, dataclasses.replace(gpu, index=1)], topology=fake_smi(["topo"]),
                            nvlink=fake_smi(["nvlink"]), lab_runs=doctor.plan_lab_runs(2, 32))
    text = str(r)
    assert doctor.NO_GPU not in text
    assert "cuda:1  NVIDIA H100 80GB HBM3  79.1 GiB  compute capability 9.0  132 SMs" in text
    assert "  GPU0\t X \tNV18" in text
    assert "GPU 0: NVIDIA H100 80GB HBM3: 2 link(s) up at 26.562 GB/s each" in text
    assert "GPU 1: NVIDIA H100 80GB HBM3: 1 link(s) up at 26.562 GB/s each, 1 inactive" in text
    assert "world_size 2: nccl, one GPU per rank (cuda:0..cuda:1)" in text
    assert r._repr_markdown_().startswith("```text\ndistlab doctor")
    assert json.loads(r.to_json())["gpus"][1]["index"] == 1


def test_plan_lab_runs() -> None:
    def plan(*args: object) -> list[tuple[int, str]]:
        return [(r.world_size, r.backend) for r in doctor.plan_lab_runs(*args)]  # type: ignore[arg-type]

    assert plan(0, 2) == [(2, "gloo"), (4, "gloo")]
    two, four = doctor.plan_lab_runs(0, 2)
    assert "one core each" in two.note and "contended" in four.note
    assert plan(1, 16) == [(1, "nccl"), (2, "gloo"), (4, "gloo")]
    assert plan(8, 64) == [(2, "nccl"), (4, "nccl"), (8, "nccl")]
    assert plan(6, 64) == [(2, "nccl"), (4, "nccl"), (6, "nccl")]
    assert plan(4, 64, False) == [(2, "gloo"), (4, "gloo")]
