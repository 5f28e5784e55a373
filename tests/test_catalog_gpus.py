"""The GPUs students have (issue 34, item 5): H200, B200 and GB200 in the catalog with their sources, and
the device names torch reports found by `distlab doctor`, chapter 8's bench and `python -m distlab.plan`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from distlab import catalog, device_names, doctor
from distlab.gpu_check import block
from distlab.hardware import bench
from distlab.hardware.probe import gpus as probe_gpus
from distlab.plan.__main__ import main as plan_main

BIB = Path(__file__).resolve().parents[1] / "book" / "references.bib"
BIB_KEYS = set(re.findall(r"^@\w+\{([^,]+),", BIB.read_text(), re.M))

# Names as torch.cuda.get_device_name / nvidia-smi print them, and the catalog row each one is.
DEVICE_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100", "NVIDIA H200": "H200", "NVIDIA B200": "B200", "NVIDIA GB200": "GB200",
    "NVIDIA A100-SXM4-80GB": "A100", "NVIDIA A100-SXM4-40GB": "A100", "Tesla V100-SXM2-32GB": "V100",
    "nvidia h200": "H200",
    # other products that share a chip or a substring with a row
    "NVIDIA H100 PCIe": None, "NVIDIA H100 NVL": None, "NVIDIA H200 NVL": None, "NVIDIA A100-PCIE-40GB": None,
    "NVIDIA GH200 480GB": None, "NVIDIA H800": None, "Tesla T4": None, "": None,
}


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_catalog_finds_the_device_names_torch_reports(name: str) -> None:
    row = device_names.gpu_for_device(name)
    assert (row.name if row else None) == DEVICE_NAMES[name]
    assert probe_gpus.gpu_model(name) == DEVICE_NAMES[name]
    assert block.catalog_gpu(name) == DEVICE_NAMES[name]  # gpu-check's block timing: eta against this peak


def test_every_catalog_entry_has_a_source_in_the_bibliography() -> None:
    for table, rows in catalog.TABLES.items():
        for row in rows:
            assert row.source in BIB_KEYS, f"{table} {row.name}: {row.source!r} is not in book/references.bib"
            assert row.note.strip(), f"{table} {row.name} has no note on direction and units"
    for gpu in catalog.TABLES["gpu"]:
        assert gpu.memory_GB is not None, f"{gpu.name} has no HBM size"
        assert catalog.lookup("nvlink", gpu.nvlink) and gpu.nvlink_GBps_per_direction > 0
        if gpu.architecture in ("Hopper", "Blackwell"):
            assert gpu.dense_fp8_tflops == pytest.approx(2 * gpu.dense_16bit_tflops, rel=1e-3)
        if gpu.architecture == "Blackwell":
            assert gpu.dense_fp4_tflops == pytest.approx(2 * gpu.dense_fp8_tflops)
        else:
            assert gpu.dense_fp4_tflops is None, f"{gpu.name} has no FP4 Tensor Cores"


def test_new_gpus_are_the_vendor_totals_divided_per_gpu_and_by_two_for_dense() -> None:
    h100, h200 = catalog.lookup("gpu", "H100"), catalog.lookup("gpu", "H200")
    b200, gb200 = catalog.lookup("gpu", "B200"), catalog.lookup("gpu", "GB200")
    # H200 page: 1,979 TFLOPS BF16 and 3,958 FP8 "with sparsity", 141 GB at 4.8 TB/s; the H100's compute.
    assert (h200.dense_16bit_tflops, h200.dense_fp8_tflops) == (1979 / 2, 3958 / 2)
    assert (h200.memory_GB, h200.memory_GBps, h200.nvlink) == (141, 4800, h100.nvlink)
    assert h200.dense_16bit_tflops == pytest.approx(h100.dense_16bit_tflops, abs=0.2)
    # HGX B200 (8 GPUs): 36 / 72 / 144 PFLOPS FP16 / FP8 / FP4 with sparsity; DGX B200: 1,440 GB at 64 TB/s.
    assert [b200.dense_16bit_tflops, b200.dense_fp8_tflops, b200.dense_fp4_tflops] == \
        [36e3 / 8 / 2, 72e3 / 8 / 2, 144e3 / 8 / 2]
    assert (b200.memory_GB, b200.memory_GBps) == (1440 / 8, 64e3 / 8)
    # GB200 superchip (2 GPUs): 10 / 20 / 40 PFLOPS with sparsity; NVL72 rack: 13.4 TB at 576 TB/s, 72 GPUs.
    assert [gb200.dense_16bit_tflops, gb200.dense_fp8_tflops, gb200.dense_fp4_tflops] == \
        [10e3 / 2 / 2, 20e3 / 2 / 2, 40e3 / 2 / 2]
    assert gb200.memory_GB == round(13.4e3 / 72) and gb200.memory_GBps == 576e3 / 72
    # NVLink 5: 1.8 TB/s per GPU both directions, 900 GB/s each way; DGX B200 14.4 TB/s = 8 GPUs x 1.8.
    assert b200.nvlink_GBps_per_direction == gb200.nvlink_GBps_per_direction == 900
    dgx = catalog.lookup("server", "DGX B200")
    chip = catalog.lookup("nvswitch", dgx.nvswitch)
    assert dgx.nvswitches * chip.ports == dgx.gpus * catalog.lookup("nvlink", b200.nvlink).links_per_gpu
    assert dgx.gpus * 2 * b200.nvlink_GBps_per_direction == 14_400
    assert gb200.pcie is None and catalog.lookup("server", "GB200 NVL72").gpu == "GB200"


@pytest.mark.parametrize("gpu", ["H200", "B200", "GB200", "NVIDIA H200", "h100"])
def test_plan_cli_accepts_each_gpu(gpu: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = plan_main(["--preset", "tiny", "--gpu", gpu, "--nodes", "2", "--batch", "16", "--json"])
    out = json.loads(capsys.readouterr().out)
    name = device_names.gpu_for_device(gpu).name
    assert status == 0 and out["cluster"]["gpu"] == name
    assert out["cluster"]["hbm_bytes"] == catalog.lookup("gpu", name).memory_GB * 1e9 or name == "H100"
    assert out["cluster"]["intra_GBps"] == catalog.lookup("gpu", name).nvlink_GBps_per_direction


def test_plan_cli_refuses_an_unknown_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        plan_main(["--preset", "tiny", "--gpu", "B300"])
    assert e.value.code == 2 and "argument --gpu: invalid choice: 'B300'" in capsys.readouterr().err


def test_bench_finds_the_h200_it_ran_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # Chapter 8's bench printed "GPU not in the catalog" on an NVIDIA H200 (issue 34).
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: object())  # no PCI address
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    assert bench._gpu_spec(0).name == "H200"
    assert bench._pcie_spec(0, []) == (pytest.approx(63.0, abs=0.1), "PCIe 5.0 x16, per direction")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA GB200")
    spec, why = bench._pcie_spec(0, [])
    assert spec is None and "NVLink-C2C" in why
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 PCIe")
    spec, why = bench._pcie_spec(0, [])
    assert spec is None and why.startswith("NVIDIA H100 PCIe not in the catalog (it holds the SXM parts")


def test_doctor_names_the_catalog_row_of_each_gpu() -> None:
    here = doctor.report(smi=lambda args: None)
    gpus = [doctor.GPU(i, n, 139.8, "9.0", 132) for i, n in enumerate(("NVIDIA H200", "NVIDIA B200", "X"))]
    text = str(type(here)(**{**here.__dict__, "gpus": gpus}))
    assert "catalog: H200 (Hopper): 141 GB HBM at 4800 GB/s; dense TFLOPS 989.5 FP16/BF16, 1979 FP8; " \
           "NVLink 4, 450 GB/s per direction" in text
    assert "catalog: B200 (Blackwell): 180 GB HBM at 8000 GB/s" in text and "9000 FP4" in text
    assert "catalog: not in distlab.catalog (it holds P100, V100, A100, H100, H200, B200, GB200" in text
