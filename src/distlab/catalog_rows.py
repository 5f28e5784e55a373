"""The row types of `distlab.catalog` that need no other row: a PCIe generation, an NVLink generation, a
server and an InfiniBand rate, each a frozen dataclass whose derived figures (per lane to per link, Gb/s to
GB/s, one direction to both) are computed, not typed. The conventions are `distlab.catalog`'s: ``_GBps`` is
gigabytes per second, ``_Gbps`` gigabits per second, ``per_direction`` one way of a full-duplex link.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PCIeGen:
    """One PCI Express generation (PCI-SIG base specifications)."""

    name: str
    gt_per_s: float  # transfers per second per lane, in GT/s (one bit per transfer up to 5.0, NRZ)
    encoding: str
    efficiency: float  # data bits / line bits after the encoding (6.0: data bytes / FLIT bytes)
    source: str
    note: str

    @property
    def lane_GBps_per_direction(self) -> float:
        """GB/s of one lane, one direction, after the encoding: GT/s x efficiency / 8 bits per byte.
        Packet headers and flow control come on top (the same for every row), so copies see less."""
        return self.gt_per_s * self.efficiency / 8

    def link_GBps_per_direction(self, lanes: int = 16) -> float:
        """GB/s of an x`lanes` link, one direction."""
        if lanes not in (1, 2, 4, 8, 16):
            raise ValueError(f"lanes={lanes!r} is not a PCIe link width; use 1, 2, 4, 8 or 16")
        return lanes * self.lane_GBps_per_direction


@dataclass(frozen=True)
class NVLinkGen:
    """One NVLink generation as used by its first data-centre GPU."""

    name: str
    gpu: str
    links_per_gpu: int
    link_GBps_per_direction: float
    source: str
    note: str

    @property
    def link_GBps_bidirectional(self) -> float:
        """One link, both directions added (the figure NVIDIA quotes per link)."""
        return 2 * self.link_GBps_per_direction

    @property
    def gpu_GBps_per_direction(self) -> float:
        """All of one GPU's links, one direction."""
        return self.links_per_gpu * self.link_GBps_per_direction

    @property
    def gpu_GBps_bidirectional(self) -> float:
        """All of one GPU's links, both directions added (NVIDIA's headline figure per GPU)."""
        return 2 * self.gpu_GBps_per_direction


@dataclass(frozen=True)
class Server:
    """One multi-GPU server: how its GPUs are wired together and to the network."""

    name: str
    gpu: str
    gpus: int
    gpu_fabric: str  # "hybrid cube-mesh", or "NVSwitch" (every GPU one hop from every other)
    nvswitch: str | None
    nvswitches: int | None
    nics: int | None  # network ports for GPU traffic (InfiniBand HCAs)
    nic_Gbps: float | None  # per NIC, per direction, Gb/s
    source: str
    note: str

    @property
    def nic_GBps_per_direction(self) -> float | None:
        """One NIC, one direction, in GB/s (Gb/s / 8)."""
        return None if self.nic_Gbps is None else self.nic_Gbps / 8


@dataclass(frozen=True)
class InfiniBandSpeed:
    """One InfiniBand data rate (InfiniBand Trade Association roadmap)."""

    name: str
    lane_signal_Gbps: float | None  # line rate of one lane, before encoding (None: not verified here)
    encoding: str
    lane_data_Gbps: float  # payload rate of one lane after encoding, one direction
    x4_Gbps: float  # the rate a 4x port is sold as, one direction
    source: str
    note: str

    @property
    def x4_data_GBps_per_direction(self) -> float:
        """Payload GB/s of a 4x port, one direction: 4 lanes x lane data rate / 8."""
        return 4 * self.lane_data_Gbps / 8
