"""Tests for chapter 8 (distlab.hardware): catalog, probe on fake trees, bench on CPU, simulator, checks."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from distlab import catalog
from distlab.checks import NOT_WRITTEN
from distlab.collectives import cost_model
from distlab.hardware import __main__ as cli
from distlab.hardware import bench, exercises, probe, topology
from distlab.hardware import cost_model as hw_cost
from distlab.hardware.probe import gpus as probe_gpus
from distlab.hardware.probe import host as probe_host

BOOK = Path(__file__).resolve().parents[2] / "book" / "08-hardware.md"


# --------------------------------------------------------------------------------------------------
# catalog
# --------------------------------------------------------------------------------------------------

BIB_KEYS = set(re.findall(r"^@\w+\{([^,]+),", (BOOK.parent / "references.bib").read_text(), re.M))


def test_catalog_derived_figures_match_the_vendors_headlines() -> None:
    # Headline figures as the sources print them; the catalog stores per-link/per-lane values only.
    assert [catalog.lookup("nvlink", g).gpu_GBps_bidirectional for g in catalog.names("nvlink")] == \
        [160, 300, 600, 900, 1800]
    assert catalog.lookup("nvlink", "NVLink 5").link_GBps_bidirectional == 100
    assert catalog.lookup("pcie", "PCIe 3.0").link_GBps_per_direction(16) == pytest.approx(15.75, abs=0.01)
    assert catalog.lookup("pcie", "PCIe 4.0").link_GBps_per_direction(16) == pytest.approx(31.5, abs=0.02)
    assert catalog.lookup("pcie", "pcie 5.0").link_GBps_per_direction(16) * 2 == pytest.approx(126, abs=0.1)
    rates = ("EDR", "HDR", "NDR", "XDR")
    assert [catalog.lookup("infiniband", r).x4_data_GBps_per_direction for r in rates] == [12.5, 25, 50, 100]
    assert catalog.lookup("nvswitch", "NVSwitch 1").switch_GBps_bidirectional() == 900
    assert catalog.lookup("server", "DGX A100").nic_GBps_per_direction == 25
    for table in catalog.TABLES:  # every row cites a key that the bibliography holds
        for row in catalog.TABLES[table]:
            assert row.source in BIB_KEYS, f"{table} {row.name}: source {row.source!r} not in references.bib"
            assert row.note
    assert catalog.as_dicts("gpu")[0]["name"] == "P100"


def test_catalog_rows_a_reviewer_checked() -> None:
    # PCIe 6.0: 64 GT/s x 16 lanes / 8 = 128 GB/s raw per direction; 242 of each 256-byte FLIT carry data.
    pcie6 = catalog.lookup("pcie", "PCIe 6.0")
    assert pcie6.gt_per_s * 16 / 8 == 128
    assert pcie6.link_GBps_per_direction(16) == pytest.approx(121.0, abs=0.01)
    # 2.0 -> 3.0 did not double the GT/s; the 128b/130b encoding made up the difference.
    gen2, gen3 = catalog.lookup("pcie", "PCIe 2.0"), catalog.lookup("pcie", "PCIe 3.0")
    assert (gen2.gt_per_s, gen3.gt_per_s) == (5.0, 8.0)
    assert gen3.lane_GBps_per_direction / gen2.lane_GBps_per_direction == pytest.approx(1.97, abs=0.01)
    # The NVSwitch table holds chips: NVL72's 72 GPUs x 18 NVLinks land on 18 chips of 72 ports.
    chip, nvl72 = catalog.lookup("nvswitch", "NVLink Switch chip"), catalog.lookup("server", "GB200 NVL72")
    assert nvl72.nvswitch == chip.name and nvl72.nvswitches * chip.ports == 72 * 18
    assert chip.switch_GBps_bidirectional() == 7200  # NVIDIA's 14.4 TB/s is the two-chip switch tray
    # NVSwitch 2 (LR10): 36 ports, from NVIDIA's NVSwitch driver; a DGX A100 uses 16 of each chip's 36.
    gen2 = catalog.lookup("nvswitch", "NVSwitch 2")
    assert (gen2.ports, gen2.switch_GBps_bidirectional()) == (36, 1800)


def test_catalog_bad_names() -> None:
    with pytest.raises(ValueError, match=r"unknown gpu 'B300'; known: P100, V100, A100, H100"):
        catalog.lookup("gpu", "B300")
    with pytest.raises(ValueError, match=r"unknown table 'nvlinks'; choose one of pcie, nvlink"):
        catalog.names("nvlinks")
    with pytest.raises(ValueError, match=r"lanes=3 is not a PCIe link width"):
        catalog.lookup("pcie", "PCIe 4.0").link_GBps_per_direction(3)


def test_book_tables_are_the_catalog() -> None:
    text = BOOK.read_text()
    for table in catalog.TABLES:
        assert catalog.markdown_table(table) in text, \
            f"book/08-hardware.md lacks the current {table} table: paste catalog.markdown_table({table!r})"


# --------------------------------------------------------------------------------------------------
# probe, on fake trees and fake nvidia-smi output
# --------------------------------------------------------------------------------------------------

TOPO = """\
\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV12\tPXB\t0-63\t0
GPU1\tNV12\t X \tSYS\t0-63\t0
NIC0\tPXB\tSYS\t X \t\t

Legend:
  X    = Self"""

NVLINK = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: a)\n\t Link 0: 25 GB/s\n\t Link 1: <inactive>\n" \
         "GPU 1: NVIDIA A100-SXM4-40GB (UUID: b)\n\t Link 0: 25 GB/s"


def fake_smi(args: list[str]) -> str | None:
    if args[0].startswith("--query-gpu"):
        return "0, NVIDIA A100-SXM4-40GB, 535.104\n1, NVIDIA A100-SXM4-40GB, 535.104"
    return {"topo": TOPO, "nvlink": NVLINK}.get(args[0])


def fake_sys(root: Path) -> Path:
    pci = root / "bus" / "pci" / "devices"
    for addr, vendor, cls, speed, width in (("0000:07:00.0", "0x10de", "0x030200", "16.0 GT/s PCIe", "16"),
                                            ("0000:0f:00.0", "0x10de", "0x030000", "8.0 GT/s PCIe", "8"),
                                            ("0000:05:00.0", "0x10de", "0x068000", "8.0 GT/s PCIe", "2"),
                                            ("0000:01:00.0", "0x15b3", "0x020700", "16.0 GT/s PCIe", "16")):
        d = pci / addr  # two GPUs, an NVSwitch (a bridge, left out) and a Mellanox NIC (another vendor)
        d.mkdir(parents=True)
        for name, text in (("vendor", vendor), ("class", cls), ("current_link_speed", speed),
                           ("current_link_width", width),
                           ("max_link_speed", "16.0 GT/s PCIe"), ("max_link_width", "16")):
            (d / name).write_text(text + "\n")
    for n, cpus, kb in ((0, "0-31", 16777216), (1, "32-63", 8388608)):
        d = root / "devices" / "system" / "node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(f"Node {n} MemTotal:  {kb} kB\nNode {n} MemFree: 1 kB\n")
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    for name, text in (("state", "4: ACTIVE"), ("rate", "200 Gb/sec (4X HDR)"), ("link_layer", "InfiniBand")):
        (port / name).write_text(text + "\n")
    return root


def test_probe_fake_machine(tmp_path: Path) -> None:
    p = probe.probe(sys_root=fake_sys(tmp_path), proc_root=tmp_path, smi=fake_smi, nvml=False)
    assert [(g.name, g.nvlinks_active) for g in p.gpus] == [("NVIDIA A100-SXM4-40GB", 1)] * 1 + \
        [("NVIDIA A100-SXM4-40GB", 1)]
    assert p.gpu_source == "nvidia-smi" and p.driver == "535.104"
    assert [(k.address, k.generation, k.width) for k in p.pcie] == [("0000:07:00.0", "PCIe 4.0", 16),
                                                                   ("0000:0f:00.0", "PCIe 3.0", 8)]
    assert [(n.node, n.cpus, n.memory_gib) for n in p.numa] == [(0, "0-31", 16.0), (1, "32-63", 8.0)]
    assert p.infiniband[0].ports[0].rate == "200 Gb/sec (4X HDR)"
    text = str(p)
    assert "GPU1: NVIDIA A100-SXM4-40GB, 1 NVLink(s) active" in text and "node1: CPUs 32-63, 8.0 GiB" in text
    assert "16.0 GT/s x16 (PCIe 4.0" in text and probe_gpus.NO_GPU_PROBE not in text
    matrix = probe_gpus.parse_topology(TOPO)
    assert matrix[("GPU0", "GPU1")] == "NV12" and matrix[("GPU0", "NIC0")] == "PXB"
    assert probe_gpus.nvlinks_between(matrix, "GPU1", "GPU0") == 12
    assert probe_gpus.nvlinks_between(matrix, "GPU0", "NIC0") == 0
    assert probe_gpus.gpu_model("NVIDIA H100 80GB HBM3") == "H100"
    assert probe_gpus.gpu_model("Tesla T4") is None


def test_probe_with_nothing(tmp_path: Path) -> None:
    none = tmp_path / "none"
    p = probe.probe(sys_root=none, proc_root=none, smi=lambda args: None, nvml=False)
    assert (p.gpus, p.pcie, p.infiniband, p.numa, p.memory, p.topology) == ([], [], [], [], {}, None)
    text = str(p)
    assert probe_gpus.NO_GPU_PROBE in text and "none (multi-node traffic would use TCP sockets)" in text
    assert probe_gpus.parse_topology("") == {} and probe_host.pcie_generation(None) is None
    here = probe.probe(nvml=False)  # this machine: whatever it has, the probe completes
    assert json.dumps(here.to_dict())


class FakeNVML:
    """Just enough of pynvml for two GPUs with 12 active NVLinks each."""

    NVML_NVLINK_MAX_LINKS = 18

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link >= 12:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54"


def test_probe_nvml(tmp_path: Path) -> None:
    p = probe.probe(sys_root=tmp_path, proc_root=tmp_path, smi=lambda args: None, nvml=FakeNVML())  # type: ignore
    assert [(g.index, g.nvlinks_active) for g in p.gpus] == [(0, 12), (1, 12)]
    assert p.gpu_source == "NVML (pynvml)" and p.driver == "550.54"


# --------------------------------------------------------------------------------------------------
# bench: host path measured, GPU paths skipped here, the JSON entry point, the collective
# --------------------------------------------------------------------------------------------------

def test_bench_cpu_paths_and_json(tmp_path: Path) -> None:
    host = bench.host_copy(1 << 20, repeats=2)
    assert host.measured_GBps > 0 and host.spec_GBps is None and host.percent_of_spec is None
    gpu = bench.gpu_results(1 << 20, repeats=2)
    if not torch.cuda.is_available():
        assert [r.test for r in gpu] == list(bench.GPU_TESTS)
        assert all(r.measured_GBps is None and r.note == bench.NO_GPU_SKIP for r in gpu)
    else:
        assert all(r.measured_GBps is None or r.measured_GBps > 0 for r in gpu)
    assert bench.Result("x", 50.0, 200.0, "", "").percent_of_spec == 25
    text = bench.format_results([host, *gpu])
    assert text.splitlines()[0].startswith("test") and "host copy" in text
    out = tmp_path / "ref.json"
    data = cli.main(["--out", str(out), "--bytes", "1048576", "--repeats", "2", "--size", "64K"])
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(data))
    assert {"gpus", "driver", "cuda", "nccl", "torch"} <= set(saved["hardware"])
    assert saved["command"].startswith("python -m distlab.hardware --out")
    busbw = [r for r in saved["results"] if r["test"].startswith("all_reduce busbw")]
    assert len(busbw) == 1 and busbw[0]["measured_GBps"] > 0
    with pytest.raises(ValueError, match=r"nbytes=0 must be an integer >= 1"):
        bench.host_copy(0)
    with pytest.raises(ValueError, match=r"world_size=1 must be an integer >= 2"):
        bench.collective(1)


def test_bench_matches_a_gpu_to_its_pcie_link_by_address(monkeypatch: pytest.MonkeyPatch) -> None:
    # CUDA numbers GPUs fastest first by default, not in PCI order: match sysfs links by PCI address.
    from types import SimpleNamespace

    links = [probe_host.PCIeLink("0000:07:00.0", 16.0, 16, 16.0, 16),
             probe_host.PCIeLink("0000:0f:00.0", 8.0, 8, 16.0, 16)]
    props = SimpleNamespace(pci_bus_id=0x0F, pci_device_id=0, pci_domain_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    assert bench._pcie_spec(0, links) == (pytest.approx(8 * 8 * 128 / 130 / 8), "PCIe 3.0 x8, per direction")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace())
    assert bench._pcie_spec(0, links)[1] == "PCIe 4.0 x16, per direction"  # no PCI address: entry 0


# --------------------------------------------------------------------------------------------------
# hw_cost (distlab.hardware.cost_model)
# --------------------------------------------------------------------------------------------------

def line_ring(p: int, GBps: float = 10.0, latency: float = 5e-6) -> topology.Topology:
    topo = topology.Topology("ring")
    for i in range(p):
        topo.add_node(f"g{i}", "gpu")
    for i in range(p):
        if p > 1 and not (p == 2 and i == 1):
            topo.add_link(f"g{i}", f"g{(i + 1) % p}", GBps, latency, "test")
    return topo


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7])
def test_ring_matches_chapter_1_textbook_formula(p: int) -> None:
    # Equal hops: the simulator's ring is Chapter 1's 2(p-1) alpha + 2(p-1)/p n beta (float64, exact formula).
    n = np.array([0.0, 1e3, 1e6, 3e8])
    params = cost_model.MachineParams(alpha=5e-6, beta=1 / 10e9)
    want = cost_model.ring_all_reduce_time(n, p, params)
    got = hw_cost.ring_all_reduce_time(line_ring(p), [f"g{i}" for i in range(p)], n)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # ... and the formula written out, since the simulator now calls the cost model for each hop.
    np.testing.assert_allclose(got, 2 * (p - 1) * 5e-6 + 2 * (p - 1) / p * n / 10e9, rtol=1e-12)


def test_cluster_predictions_and_bottlenecks() -> None:
    one = topology.Cluster("DGX A100", 1)
    assert len(one.topology.gpus()) == 8 and "fabric" not in one.topology.nodes
    hop = hw_cost.bottleneck(one.topology, one.flat_ring())
    assert hop.GBps == 300 and hop.path[1] == "n0/nvswitch"  # NVLink 3, 12 links x 25 GB/s per direction
    four = topology.Cluster("DGX A100", 4)
    flat = hw_cost.bottleneck(four.topology, four.flat_ring())
    assert flat.GBps == 25 and flat.bottleneck.kind == "InfiniBand 200 Gb/s"  # the ring waits for the NIC
    n = 2.0**30
    t = {a: float(hw_cost.predict_all_reduce(four, n, a)) for a in hw_cost.ALGORITHMS}
    assert t["two_level_ring"] < t["tree"] < t["flat_ring"]
    small = {a: float(hw_cost.predict_all_reduce(four, 1024, a)) for a in hw_cost.ALGORITHMS}
    assert small["tree"] < small["two_level_ring"] < small["flat_ring"]  # log2 N latency terms win small
    # The flat ring's bandwidth term is that of a 32-rank ring on the NIC alone.
    zero = topology.Cluster("DGX A100", 4, topology.Latencies(0, 0, 0))
    assert float(hw_cost.predict_all_reduce(zero, n, "flat_ring")) == pytest.approx(2 * 31 / 32 * n / 25e9)
    # The two-level ring's bandwidth terms (book): 2 (m-1)/m n / B_nv + 2 (N-1)/N (n/m) / B_net.
    want = 2 * 7 / 8 * n / 300e9 + 2 * 3 / 4 * (n / 8) / 25e9
    assert float(hw_cost.predict_all_reduce(zero, n, "two_level_ring")) == pytest.approx(want, rel=1e-12)
    dgx1 = topology.Cluster("DGX-1", 2, topology.Latencies(0, 0, 0))
    inside = hw_cost.bottleneck(dgx1.topology, [dgx1.gpu(0, j) for j in dgx1.intra_order])
    assert inside.GBps == 50  # every hop of DGX1_RING has two NVLinks
    naive = hw_cost.bottleneck(topology.server_topology("DGX-1"), [f"gpu{i}" for i in range(8)])
    assert naive.GBps == 25 and (naive.src, naive.dst) == ("gpu0", "gpu1")
    # Two DGX-1 GPUs share each NIC: their cross-server rings share it too.
    rings = [[dgx1.gpu(0, 0), dgx1.gpu(1, 0)], [dgx1.gpu(0, 1), dgx1.gpu(1, 1)]]
    hops = hw_cost.ring_hops(dgx1.topology, rings)
    assert {h.GBps for ring in hops for h in ring} == {6.25}


def test_simulate_bad_input() -> None:
    topo = topology.Topology("t")
    topo.add_node("a", "gpu")
    topo.add_node("b", "gpu")
    with pytest.raises(ValueError, match=r"bandwidth GBps=0 must be a finite number > 0"):
        topo.add_link("a", "b", 0, 1e-6, "x")
    with pytest.raises(ValueError, match=r"bandwidth GBps=-5 must be a finite number > 0"):
        topo.add_link("a", "b", -5, 1e-6, "x")
    with pytest.raises(ValueError, match=r"latency=nan must be a finite number >= 0"):
        topo.add_link("a", "b", 1, math.nan, "x")
    with pytest.raises(ValueError, match=r"node 'c' is not in topology 't'; add it first"):
        topo.add_link("a", "c", 1, 0, "x")
    with pytest.raises(ValueError, match=r"topology 't' is disconnected: b cannot be reached from 'a'"):
        topo.check_connected()
    with pytest.raises(ValueError, match=r"disconnected: no path from 'a' to 'b'; add a link"):
        hw_cost.ring_all_reduce_time(topo, ["a", "b"], 1e6)
    with pytest.raises(ValueError, match=r"server 'DGX B200' cannot be simulated; choose one of DGX-1"):
        topology.Cluster("DGX B200", 2)
    with pytest.raises(ValueError, match=r"nodes=0 must be a positive integer number of servers"):
        topology.Cluster("DGX H100", 0)
    cluster = topology.Cluster("DGX H100", 2)
    with pytest.raises(ValueError, match=r"unknown algorithm 'ring'; choose one of flat_ring"):
        hw_cost.predict_all_reduce(cluster, 1e6, "ring")
    with pytest.raises(ValueError, match=r"nbytes=-1 must be sizes in bytes >= 0"):
        hw_cost.predict_all_reduce(cluster, -1)
    with pytest.raises(ValueError, match=r"\['n0/nvswitch'\] which are not GPUs"):
        hw_cost.bottleneck(cluster.topology, ["n0/gpu0", "n0/nvswitch"])
    with pytest.raises(ValueError, match=r"visits a GPU twice"):
        hw_cost.bottleneck(cluster.topology, ["n0/gpu0", "n0/gpu1", "n0/gpu0"])


# --------------------------------------------------------------------------------------------------
# exercises and figures
# --------------------------------------------------------------------------------------------------

def test_exercise_checks_name_the_mistake() -> None:
    right = exercises.two_level_ring_time("DGX A100", 4, 2**30)
    report = exercises.check_two_level_ring(right)
    assert report and str(report).startswith("two-level ring, bandwidth term: PASSED (1 of 1 passed)")
    assert "Correct:" in str(report) and "4 x DGX A100, all-reduce of 1 GiB" in str(report)
    for mistakes, phrase in ((("bidirectional",), "bidirectional"), (("bits",), "Gb/s as if it were GB/s"),
                             (("ring_factor",), "2(p-1)/p"), (("whole_vector",), "all n bytes"),
                             (("bits", "ring_factor"), "Gb/s as if it were GB/s")):
        wrong = exercises.two_level_ring_time("DGX A100", 4, 2**30, mistakes)
        report = exercises.check_two_level_ring(wrong)
        assert not report and "Not yet" in str(report) and phrase in str(report), report
        with pytest.raises(AssertionError, match="Not yet"):
            report.raise_if_failed()
    assert "matches none of the usual mistakes" in str(exercises.check_two_level_ring(right * 1.37))
    assert "positive number" in str(exercises.check_two_level_ring(float("nan")))
    report = exercises.check_ring_bottleneck(25)
    assert report and "The slowest hop is" in str(report) and "<table>" in report._repr_html_()
    assert "bidirectional" in str(exercises.check_ring_bottleneck(50))
    assert "Gb/s as if it were GB/s" in str(exercises.check_ring_bottleneck(200))
    assert exercises.check_ring_bottleneck(50, topology.DGX1_RING)
    with pytest.raises(ValueError, match=r"unknown mistakes \['typo'\]"):
        exercises.two_level_ring_time("DGX A100", 2, 1e6, ("typo",))


def test_exercise_checks_take_the_lab_functions_and_report_a_stub() -> None:
    right = exercises.two_level_ring_time("DGX A100", 4, 2**30)
    assert exercises.check_two_level_ring(lambda: right) and exercises.check_ring_bottleneck(lambda: 25)
    assert not exercises.check_ring_bottleneck(lambda: 50)

    def stub() -> float:
        raise NotImplementedError("Your turn")

    for report in (exercises.check_two_level_ring(stub), exercises.check_ring_bottleneck(stub)):
        assert not report and NOT_WRITTEN in str(report), report

    def broken() -> float:
        raise ZeroDivisionError("a real bug")

    with pytest.raises(ZeroDivisionError):  # only the stub is reported as a case; a bug is the student's
        exercises.check_two_level_ring(broken)


def test_figures_draw() -> None:
    from distlab.hardware import figures

    for fig in (figures.cube_mesh_figure(), figures.bandwidth_generations_figure(),
                figures.all_reduce_vs_size_figure("DGX H100", 2, sizes=[1e3, 1e6]),
                figures.all_reduce_vs_nodes_figure("DGX-1", 1e6, nodes=(1, 2))):
        assert fig.axes and all(ax.get_title() or not ax.has_data() for ax in fig.axes)
    box = figures.explorer()
    assert len(box.children) == 2


@pytest.mark.parametrize("argv, message", [
    (["--bytes", "abc"], "argument --bytes: 'abc' is not a whole number"),
    (["--repeats", "0"], "argument --repeats: 0 must be at least 1"),
    (["--size", "lots"], "argument --size: 'lots' is not a size such as 4096, 64K, 4M, 1G or 1e6"),
    (["--world-size", "1"], "--world-size 1: a collective needs at least 2 ranks"),
    (["--world-size", "100000"], "--world-size 100000 is more ranks than this machine can start"),
])
def test_command_line_rejects_bad_values_with_a_usage_error(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m distlab.hardware") and message in err, err


def test_command_line_help_shows_every_default(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 268435456)", "(default: 5)", "(default: 2)", "(default: 64M)"):
        assert default in text
