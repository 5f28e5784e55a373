"""Interconnect and GPU specifications as data: one table per technology, each row with its source.

Every number the book's tables, the simulator and the benchmark's "% of spec" column use lives here, once.
Each row names the bibliography key of the document it comes from (book/references.bib) and a note on
direction and units. Conventions, stated once and kept everywhere:

- ``_GBps`` is gigabytes per second (1 GB = 1e9 bytes), ``_Gbps`` gigabits per second; 1 GB/s = 8 Gb/s.
- ``per_direction`` means one way; a full-duplex link carries that much *each* way at once, and vendors'
  "bidirectional" or "total" figures are the sum of both directions, twice the per-direction figure.
- Derived figures (per-GPU NVLink totals, a PCIe x16 link in GB/s) are properties computed from the
  stored per-lane or per-link figures, so that the headline numbers vendors print are checked, not typed.

`lookup(table, name)` finds a row by name (case-insensitive) and names the known rows when it cannot;
`markdown_table(table)` renders a table for the book (tests check that the book prints exactly that).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# The row types with no lookup of their own, in a file of their own; re-exported here.
from distlab.catalog_rows import InfiniBandSpeed, NVLinkGen, PCIeGen, Server

__all__ = ["GPU", "InfiniBandSpeed", "NVLinkGen", "NVSwitchGen", "PCIeGen", "Server", "TABLES", "as_dicts",
           "lookup", "markdown_table", "names"]


@dataclass(frozen=True)
class NVSwitchGen:
    """One NVSwitch generation: an NVLink crossbar chip."""

    name: str
    nvlink: str  # name of the NVLinkGen row its ports speak
    ports: int | None  # None: not verified against a source here
    first_server: str
    source: str
    note: str

    def switch_GBps_bidirectional(self) -> float | None:
        """All ports, both directions added: ports x one link's bidirectional GB/s."""
        link = lookup("nvlink", self.nvlink)
        return None if self.ports is None else self.ports * link.link_GBps_bidirectional


@dataclass(frozen=True)
class GPU:
    """The compute side of one data-centre GPU (SXM form factor), enough for the cost models."""

    name: str
    architecture: str
    sms: int | None  # None: the cited source does not give it
    fp32_cores: int | None
    tensor_cores: int | None
    dense_16bit_tflops: float  # peak dense FP16/BF16 (Tensor Cores where present), no sparsity
    memory_GBps: float  # peak HBM bandwidth, reads and writes together
    nvlink: str
    pcie: str | None  # the host link; None: the GPU reaches its CPU another way (NVLink-C2C)
    source: str
    note: str
    memory_GB: float | None = None  # HBM capacity, GB = 1e9 bytes (the part the row describes)
    dense_fp8_tflops: float | None = None  # peak dense FP8 Tensor Core; None: no FP8 Tensor Cores
    dense_fp4_tflops: float | None = None  # peak dense FP4 Tensor Core; None: no FP4 Tensor Cores

    @property
    def nvlink_GBps_per_direction(self) -> float:
        """All of this GPU's NVLinks, one direction (from its NVLink generation's row)."""
        return lookup("nvlink", self.nvlink).gpu_GBps_per_direction


_DIR = "per direction; "
_BOTH = "both directions, all ports"
TABLES: dict[str, tuple[Any, ...]] = {
    "pcie": (
        PCIeGen("PCIe 1.0", 2.5, "8b/10b", 8 / 10, "pcisig2019pcie5", _DIR + "x16 = 4 GB/s each way"),
        PCIeGen("PCIe 2.0", 5.0, "8b/10b", 8 / 10, "pcisig2019pcie5", _DIR + "x16 = 8 GB/s each way"),
        PCIeGen("PCIe 3.0", 8.0, "128b/130b", 128 / 130, "pcisig2019pcie5", _DIR + "P100, V100 host link"),
        PCIeGen("PCIe 4.0", 16.0, "128b/130b", 128 / 130, "pcisig2019pcie5", _DIR + "A100 host link"),
        PCIeGen("PCIe 5.0", 32.0, "128b/130b", 128 / 130, "pcisig2019pcie5", _DIR + "H100 host link"),
        # FLIT mode: every 256-byte FLIT holds 236 B of TLPs, 6 B of DLLP, 8 B CRC and 6 B FEC. The 242 data
        # bytes count as the encodings above count them (DLLP traffic is not subtracted in any row); the raw
        # rate is 128 GB/s per direction for x16, and 118 GB/s if only the TLP bytes are counted.
        PCIeGen("PCIe 6.0", 64.0, "PAM4, 256 B FLIT", 242 / 256, "pcisig2022pcie6",
                _DIR + "x16 = 121 GB/s each way after the FLIT's CRC and FEC bytes (raw 128)"),
    ),
    "nvlink": (
        NVLinkGen("NVLink 1", "P100", 4, 20.0, "nvidia2016p100", "160 GB/s per GPU is both directions"),
        NVLinkGen("NVLink 2", "V100", 6, 25.0, "nvidia2017v100", "300 GB/s per GPU is both directions"),
        NVLinkGen("NVLink 3", "A100", 12, 25.0, "nvidia2021a100", "600 GB/s per GPU is both directions"),
        NVLinkGen("NVLink 4", "H100", 18, 25.0, "nvidia2023h100", "900 GB/s per GPU is both directions"),
        NVLinkGen("NVLink 5", "Blackwell", 18, 50.0, "nvidia2024nvlink",
                  "100 GB/s per link and 1.8 TB/s per GPU are both directions"),
    ),
    "nvswitch": (
        NVSwitchGen("NVSwitch 1", "NVLink 2", 18, "DGX-2", "nvidia2018nvswitch", _BOTH),
        # The A100 papers give no port count; NVIDIA's own NVSwitch driver does: the second-generation chip
        # (code name LR10) has NUM_NPORT_ENGINE_LR10 = 36 NVLink ports (the third, LS10: 16 x 4 = 64).
        NVSwitchGen("NVSwitch 2", "NVLink 3", 36, "DGX A100", "nvidia2022lr10",
                    "both directions, all ports; a DGX A100 uses 16 of each chip's 36 ports (8 GPUs x 12 "
                    "links / 6 chips): 4.8 TB/s over its six chips (nvidia2020ampere)"),
        NVSwitchGen("NVSwitch 3", "NVLink 4", 64, "DGX H100", "nvidia2022nvswitch3",
                    "both directions, all ports; adds NVLink SHARP (in-switch reduction)"),
        # One chip. NVIDIA's "NVLink Switch: 144 ports, 14.4 TB/s" is the 1U switch tray, which holds two of
        # them; a GB200 NVL72 has 9 trays, 18 chips: 72 GPUs x 18 links = 18 chips x 72 ports.
        NVSwitchGen("NVLink Switch chip", "NVLink 5", 72, "GB200 NVL72", "nvidia2024superpodgb200",
                    "both directions, all ports; SHARP engines; a 1U switch tray holds two chips (144 ports, "
                    "14.4 TB/s, nvidia2024nvlink)"),
    ),
    # Dense peaks: vendors print Tensor Core FLOP/s "with sparsity" (2:4 structured sparsity doubles them);
    # every figure here is dense, half the sparse one where the source gives only that. HBM GB are 1e9 bytes.
    "gpu": (
        GPU("P100", "Pascal", 56, 3584, 0, 21.2, 720.0, "NVLink 1", "PCIe 3.0", "nvidia2016p100",
            "no Tensor Cores: 21.2 TFLOPS is FP16 on the CUDA cores; 16 GB HBM2", memory_GB=16.0),
        GPU("V100", "Volta", 80, 5120, 640, 125.0, 900.0, "NVLink 2", "PCIe 3.0", "nvidia2017v100",
            "125 TFLOPS: Tensor Core FP16 with FP32 accumulate; 16 GB HBM2 (a 32 GB part came later)",
            memory_GB=16.0),
        GPU("A100", "Ampere", 108, 6912, 432, 312.0, 1555.0, "NVLink 3", "PCIe 4.0", "nvidia2020ampere",
            "40 GB SXM4; 624 TFLOPS with 2:4 sparsity; the 80 GB part has 2039 GB/s (nvidia2021a100)",
            memory_GB=40.0),
        GPU("H100", "Hopper", 132, 16896, 528, 989.4, 3350.0, "NVLink 4", "PCIe 5.0", "nvidia2022hopper",
            "SXM5, 80 GB HBM3; 1979 TFLOPS BF16 and 3958 FP8 with 2:4 sparsity; 3.35 TB/s HBM3 per the "
            "datasheet (nvidia2023h100)", memory_GB=80.0, dense_fp8_tflops=1978.9),
        # The same GH100 chip as the H100 with more and faster memory (HBM3e): the page prints 1,979 TFLOPS
        # BF16 and 3,958 FP8 "with sparsity", 141 GB at 4.8 TB/s, NVLink 900 GB/s (both directions), PCIe
        # Gen5 128 GB/s (both directions). It gives no SM count.
        GPU("H200", "Hopper", None, None, None, 989.5, 4800.0, "NVLink 4", "PCIe 5.0", "nvidia2024h200",
            "SXM, 141 GB HBM3e; 1979 TFLOPS BF16 and 3958 FP8 with 2:4 sparsity", memory_GB=141.0,
            dense_fp8_tflops=1979.0),
        # HGX B200 (8 GPUs, nvidia2024hgx): 36 PFLOPS FP16/BF16, 72 FP8, 144 FP4, all "with sparsity"; a
        # DGX B200 (nvidia2024dgxb200): 1,440 GB of GPU memory at 64 TB/s in all, 72 PFLOPS (FP8)
        # training and 144 PFLOPS (FP4) inference. Per GPU: divide by 8, then by 2 for dense.
        GPU("B200", "Blackwell", None, None, None, 2250.0, 8000.0, "NVLink 5", "PCIe 5.0", "nvidia2024hgx",
            "SXM, 180 GB HBM3e (1,440 GB / 8 in a DGX B200, nvidia2024dgxb200); 4.5 PFLOPS BF16 with 2:4 "
            "sparsity; host link: the DGX B200's Xeon 8570 CPUs are PCIe 5.0", memory_GB=180.0,
            dense_fp8_tflops=4500.0, dense_fp4_tflops=9000.0),
        # GB200 NVL72 (nvidia2024gb200nvl72), per GB200 superchip (1 Grace CPU, 2 Blackwell GPUs): 10 PFLOPS
        # FP16/BF16, 20 FP8, 40 FP4 "with sparsity"; per rack of 72 GPUs: 13.4 TB HBM3e at 576 TB/s.
        GPU("GB200", "Blackwell", None, None, None, 2500.0, 8000.0, "NVLink 5", None, "nvidia2024gb200nvl72",
            "one GPU of a GB200 superchip: 186 GB HBM3e (13.4 TB / 72) at 8 TB/s (576 / 72); 5 PFLOPS BF16 "
            "with 2:4 sparsity; reaches its Grace CPU over NVLink-C2C, not PCIe", memory_GB=186.0,
            dense_fp8_tflops=5000.0, dense_fp4_tflops=10000.0),
    ),
    "server": (
        # distlab.hardware.topology's NVLink matrix numbers the GPUs as CUDA and nvidia-smi do (PCI bus
        # order; NCCL's topology dump of a DGX-1V, nccl2022dgx1topo); published drawings may number them
        # otherwise.
        Server("DGX-1", "V100", 8, "hybrid cube-mesh", None, 0, 4, 100.0, "nvidia2017dgx1",
               "NICs: 100 Gb/s InfiniBand, each shared by two GPUs"),
        Server("DGX-2", "V100", 16, "NVSwitch", "NVSwitch 1", 12, 8, 100.0, "nvidia2018nvswitch",
               "two baseboards of 8 GPUs and 6 NVSwitches"),
        Server("DGX A100", "A100", 8, "NVSwitch", "NVSwitch 2", 6, 8, 200.0, "nvidia2020dgxa100",
               "HDR InfiniBand, one NIC per GPU behind a shared PCIe switch"),
        Server("DGX H100", "H100", 8, "NVSwitch", "NVSwitch 3", 4, 8, 400.0, "nvidia2023dgxh100",
               "NDR InfiniBand (ConnectX-7), one NIC per GPU, OSFP cages"),
        # The DGX H200 is the DGX H100's chassis with H200 GPUs; one user guide covers both.
        Server("DGX H200", "H200", 8, "NVSwitch", "NVSwitch 3", 4, 8, 400.0, "nvidia2023dgxh100",
               "NDR InfiniBand (ConnectX-7), one NIC per GPU, as in the DGX H100"),
        # 2 chips x 72 ports = 8 GPUs x 18 NVLink 5 links; 14.4 TB/s NVLink in all, both directions.
        Server("DGX B200", "B200", 8, "NVSwitch", "NVLink Switch chip", 2, 8, 400.0, "nvidia2024dgxb200",
               "8 single-port ConnectX-7 NICs, up to 400 Gb/s InfiniBand or Ethernet; 14.4 TB/s NVLink in "
               "all (both directions)"),
        Server("GB200 NVL72", "GB200", 72, "NVSwitch", "NVLink Switch chip", 18, 72, 400.0,
               "nvidia2024superpodgb200", "9 switch trays of 2 chips; one NVLink domain of 72 GPUs, 130 TB/s "
               "in all (both directions, nvidia2024nvlink); one 400 Gb/s ConnectX-7 NIC per GPU for the "
               "compute fabric"),
    ),
    "infiniband": (
        InfiniBandSpeed("SDR", 2.5, "8b/10b", 2.0, 10.0, "ibta2024roadmap", "Gb/s, per direction"),
        InfiniBandSpeed("DDR", 5.0, "8b/10b", 4.0, 20.0, "ibta2024roadmap", "Gb/s, per direction"),
        InfiniBandSpeed("QDR", 10.0, "8b/10b", 8.0, 40.0, "ibta2024roadmap", "Gb/s, per direction"),
        InfiniBandSpeed("FDR", 14.0625, "64b/66b", 14.0625 * 64 / 66, 56.0, "ibta2024roadmap",
                        "Gb/s, per direction; sold as 56 (the signalling rate)"),
        InfiniBandSpeed("EDR", 25.78125, "64b/66b", 25.0, 100.0, "ibta2024roadmap", "Gb/s, per direction"),
        InfiniBandSpeed("HDR", 53.125, "PAM4 + FEC", 50.0, 200.0, "ibta2024roadmap", "Gb/s, per direction"),
        InfiniBandSpeed("NDR", 106.25, "PAM4 + FEC", 100.0, 400.0, "ibta2024roadmap", "Gb/s, per direction"),
        InfiniBandSpeed("XDR", None, "PAM4 + FEC", 200.0, 800.0, "ibta2024roadmap", "Gb/s, per direction"),
    ),
}

COLUMNS: dict[str, tuple[tuple[str, str, str], ...]] = {  # (header, attribute or property, format)
    "pcie": (("generation", "name", "s"), ("GT/s per lane", "gt_per_s", "g"), ("encoding", "encoding", "s"),
             ("GB/s per lane, per direction", "lane_GBps_per_direction", ".3f"),
             ("GB/s x16, per direction", "x16", ".2f"), ("source", "source", "cite")),
    "nvlink": (("generation", "name", "s"), ("first GPU", "gpu", "s"),
               ("links per GPU", "links_per_gpu", "d"),
               ("GB/s per link, per direction", "link_GBps_per_direction", "g"),
               ("GB/s per GPU, per direction", "gpu_GBps_per_direction", "g"),
               ("GB/s per GPU, both directions", "gpu_GBps_bidirectional", "g"),
               ("source", "source", "cite")),
    "nvswitch": (("generation", "name", "s"), ("NVLink", "nvlink", "s"), ("ports", "ports", "d"),
                 ("GB/s all ports, both directions", "switch", "g"), ("first server", "first_server", "s"),
                 ("source", "source", "cite")),
    "gpu": (("GPU", "name", "s"), ("architecture", "architecture", "s"), ("SMs", "sms", "d"),
            ("HBM GB", "memory_GB", "g"), ("HBM GB/s", "memory_GBps", "g"),
            ("dense FP16/BF16 TFLOPS", "dense_16bit_tflops", "g"),
            ("dense FP8 TFLOPS", "dense_fp8_tflops", "g"), ("dense FP4 TFLOPS", "dense_fp4_tflops", "g"),
            ("NVLink", "nvlink", "s"),
            ("NVLink GB/s per GPU, per direction", "nvlink_GBps_per_direction", "g"), ("PCIe", "pcie", "s"),
            ("source", "source", "cite")),
    "server": (("server", "name", "s"), ("GPUs", "gpus", "s"), ("GPU fabric", "gpu_fabric", "s"),
               ("NVSwitch chips", "nvswitches", "s"), ("NICs for GPU traffic", "nics", "s"),
               ("Gb/s per NIC, per direction", "nic_Gbps", "g"), ("source", "source", "cite")),
    "infiniband": (("rate", "name", "s"), ("Gb/s per lane, signalling", "lane_signal_Gbps", ".7g"),
                   ("encoding", "encoding", "s"), ("Gb/s per lane, data", "lane_data_Gbps", ".4g"),
                   ("Gb/s 4x port", "x4_Gbps", "g"), ("GB/s 4x port, per direction", "x4_data_GBps", ".4g"),
                   ("source", "source", "cite")),
}


def _check_table(table: str) -> tuple[Any, ...]:
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; choose one of {', '.join(TABLES)}")
    return TABLES[table]


def names(table: str) -> list[str]:
    """The row names of `table`, in order."""
    return [row.name for row in _check_table(table)]


def lookup(table: str, name: str) -> Any:
    """The row of `table` called `name` (case and spaces ignored); ValueError listing the names if absent."""
    rows = _check_table(table)
    key = "".join(str(name).lower().split())
    for row in rows:
        if "".join(row.name.lower().split()) == key:
            return row
    raise ValueError(f"unknown {table} {name!r}; known: {', '.join(names(table))} "
                     f"(add a row with its source to distlab.catalog.TABLES[{table!r}])")


def as_dicts(table: str) -> list[dict[str, Any]]:
    """`table` as plain dicts (fields only, no derived values), e.g. for pandas or JSON."""
    return [{f.name: getattr(row, f.name) for f in fields(row)} for row in _check_table(table)]


def _cell(row: Any, attribute: str, fmt: str) -> str:
    derived = {"x16": lambda: row.link_GBps_per_direction(16),
               "switch": lambda: row.switch_GBps_bidirectional(),
               "x4_data_GBps": lambda: row.x4_data_GBps_per_direction}
    value = derived[attribute]() if attribute in derived else getattr(row, attribute)
    if value is None:
        return "–"
    if fmt == "cite":
        return f"{{cite}}`{value}`"
    return format(value, fmt) if fmt != "s" else str(value)


def markdown_table(table: str) -> str:
    """`table` as a Markdown pipe table, the exact text the book prints (a test compares them)."""
    rows = _check_table(table)
    cols = COLUMNS[table]
    lines = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(row, a, f) for _, a, f in cols) + " |" for row in rows]
    return "\n".join(lines)
