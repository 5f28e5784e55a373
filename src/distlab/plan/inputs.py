"""What the planner is asked: a model, a cluster and a global batch, each a validated dataclass.

`ModelSpec` is a decoder described as chapter 7's estimator describes one (layers, hidden, heads,
vocabulary, sequence length), with the shape options of `distlab.memory.estimate.shape` (grouped-query
attention, an FFN size, a gated MLP, untied embeddings, no learned positions). `PRESETS` names published
shapes. `ClusterSpec` is a number of identical servers from `distlab.catalog`:
its GPU's peak dense 16-bit FLOP/s, the NVLink bandwidth inside a server and the InfiniBand NICs across
servers come from the catalog's rows; the HBM capacity, which the catalog does not hold, comes from
`HBM_GB` here (each row with its source). `Workload` is the global batch and the kernels' efficiency
(`distlab.plan.efficiency`). Every error names the parameter, its value and the fix, and values beyond any
real machine are refused with the bound (`distlab.plan.limits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distlab import catalog
from distlab.collectives.cost_model import MachineParams
from distlab.model_shape import ModelShape
from distlab.plan import limits
from distlab.plan.efficiency import efficiency_for
from distlab.topology import Latencies

# HBM capacity per GPU in GB (1e9 bytes). The catalog's A100 row is the 40 GB SXM4 part; the 80 GB part
# (Selene, the Megatron-LM runs) is listed in the same datasheet family (nvidia2021a100: "80GB HBM2e").
HBM_GB = {
    "V100": (32.0, "nvidia2017v100", "the 32 GB SXM2 part"),
    "A100": (80.0, "nvidia2021a100", "the 80 GB SXM4 part (a 40 GB part exists too)"),
    "H100": (80.0, "nvidia2023h100", "SXM5, 80 GB HBM3"),
    # The newer GPUs: the catalog's row is the part the planner models (its memory_GB, with its source).
    **{g: (catalog.lookup("gpu", g).memory_GB, catalog.lookup("gpu", g).source, "the catalog's row")
       for g in ("H200", "B200", "GB200")},
}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: `layers` blocks of width `hidden` with `heads` attention heads
    (`kv_heads` key/value heads, grouped-query attention; None = heads), an MLP of hidden size `ffn`
    (None = 4 hidden; `gated` for SwiGLU's three matrices), a `vocab`-token embedding (`tied` to the
    output layer or not), a learned position embedding or not (`positions`), and sequences of `seq` tokens.
    Its sizes are the course's one model shape (`model_shape`), whose count chapter 7's estimator uses too."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    kv_heads: int | None = None
    name: str = "custom"
    ffn: int | None = None
    gated: bool = False
    tied: bool = True
    positions: bool = True

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_heads()
        if self.ffn is not None:
            limits.check_int("ffn", self.ffn, 1)
        if self.params > MAX_PARAMS:
            raise ValueError(f"model of {self.params:.3g} parameters is beyond any trained model: the bound "
                             f"is {MAX_PARAMS:.0e} (the largest dense models have about 2e12); check the "
                             "shape")

    def _check_sizes(self) -> None:
        """layers, hidden, heads, vocab and seq: positive integers within `limits`."""
        for field in ("layers", "hidden", "heads", "vocab", "seq"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model {field}={v!r} must be a positive integer, e.g. --{field} 8")
            limits.check_int(field, v, 1)

    def _check_heads(self) -> None:
        """heads that divide hidden, and kv_heads (if given) that divide heads."""
        if self.hidden % self.heads:
            raise ValueError(f"model hidden={self.hidden} is not divisible by heads={self.heads}; "
                             "choose heads that divide the hidden size")
        kv = self.kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.heads % kv):
            raise ValueError(f"model kv_heads={kv!r} must be a positive integer that divides "
                             f"heads={self.heads}; or leave it out (kv_heads = heads)")

    def shape(self) -> dict[str, Any]:
        """The shape options chapter 7's `MemoryConfig` takes."""
        return dict(kv_heads=self.kv_heads, ffn=self.ffn, gated=self.gated, tied=self.tied,
                    positions=self.positions)

    @property
    def model_shape(self) -> ModelShape:
        """The course's one `ModelShape` of this model (with biases, as the estimator counts it)."""
        return ModelShape(layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=self.vocab,
                          seq=self.seq, **self.shape())

    @property
    def params(self) -> float:
        """Parameters (`ModelShape.params`, the estimator's count): 12 h^2 + 13 h per GPT-3 block plus
        V h + s h embeddings; grouped-query attention, the FFN size, gating and untied embeddings as
        `distlab.model_shape`."""
        return self.model_shape.params

    def describe(self) -> str:
        """One line on the model behind the count: blocks, attention, MLP, embeddings."""
        h = self.hidden
        kv = f"{self.kv_heads} key/value heads (grouped-query)" if self.kv_heads not in (None, self.heads) \
            else "multi-head"
        f = self.ffn or 4 * h
        mlp = f"SwiGLU MLP f={f}" if self.gated else f"GELU MLP f={f}"
        per = self.model_shape.block_weights
        emb = ("tied" if self.tied else "untied") + " embeddings" + (", learned positions" if self.positions
                                                                    else "")
        return (f"{self.params / 1e9:.4g}B parameters: {self.layers} blocks of h={h}, {self.heads} heads, "
                f"{kv}, {mlp} ({per / (12 * h * h):.4f} x 12h^2 weights per block), vocabulary {self.vocab}, "
                f"{emb}")


MAX_PARAMS = 1e15

# Published shapes, each with its source. Megatron rows: Narayanan et al. 2021, Table 1 (vocabulary 51,200,
# sequence 2048). GPT-3 175B: Brown et al. 2020, Table 2.1. Llama 3 405B: Dubey et al. 2024, Table 3 (126
# layers, h 16,384, FFN 53,248, 128 heads, 8 key/value heads, vocabulary 128,000; SwiGLU, RoPE, untied
# output layer, sec. 3.2). BLOOM: BigScience 2022 (Le Scao et al.), Table 3 (70 layers, h 14,336, 112 heads,
# vocabulary 250,680, ALiBi positions, tied embeddings). MT-NLG: Smith et al. 2022, sec. 2.3 (105 layers,
# h 20,480, 128 heads, sequence 2048; GPT-2's 50,257-token vocabulary).
PRESETS = {
    "tiny": ModelSpec(4, 256, 8, 1024, 512, name="tiny"),
    "gpt3-175b": ModelSpec(96, 12288, 96, 50257, 2048, name="gpt3-175b"),
    "megatron-146b": ModelSpec(80, 12288, 96, 51200, 2048, name="megatron-146b"),
    "megatron-310b": ModelSpec(96, 16384, 128, 51200, 2048, name="megatron-310b"),
    "megatron-530b": ModelSpec(105, 20480, 128, 51200, 2048, name="megatron-530b"),
    "megatron-1t": ModelSpec(128, 25600, 160, 51200, 2048, name="megatron-1t"),
    "llama3-405b": ModelSpec(126, 16384, 128, 128000, 8192, kv_heads=8, name="llama3-405b", ffn=53248,
                             gated=True, tied=False, positions=False),
    "llama3-405b-128k": ModelSpec(126, 16384, 128, 128000, 131072, kv_heads=8, name="llama3-405b-128k",
                                  ffn=53248, gated=True, tied=False, positions=False),
    "bloom-176b": ModelSpec(70, 14336, 112, 250680, 2048, name="bloom-176b", positions=False),
    "mt-nlg-530b": ModelSpec(105, 20480, 128, 50257, 2048, name="mt-nlg-530b"),
}


def preset(name: str) -> ModelSpec:
    """The model called `name` in `PRESETS`, or a ValueError naming the known ones."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is unknown; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class ClusterSpec:
    """`nodes` servers of `gpus_per_node` GPUs of type `gpu`. Links default to the catalog's server for
    that GPU (NVSwitch inside, one InfiniBand NIC per GPU across); override with `intra_GBps` /
    `inter_GBps` (per GPU, per direction) and `hbm_gb`. Latencies are chapter 8's `Latencies`."""

    gpu: str = "A100"
    nodes: int = 1
    gpus_per_node: int = 8
    intra_GBps: float | None = None
    inter_GBps: float | None = None
    hbm_gb: float | None = None
    latencies: Latencies = Latencies()

    def __post_init__(self) -> None:
        if self.gpu not in HBM_GB:
            raise ValueError(f"gpu={self.gpu!r} is not in the planner's table; choose one of "
                             f"{', '.join(HBM_GB)}, or add its HBM capacity to distlab.plan.inputs.HBM_GB")
        for field in ("nodes", "gpus_per_node"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                flag = field.replace("_", "-")
                raise ValueError(f"cluster {field}={v!r} must be a positive integer, e.g. --{flag} 8")
            limits.check_int(field, v, 1)
        limits.check_int("gpus", self.nodes * self.gpus_per_node, 1)
        for field in ("intra_GBps", "inter_GBps", "hbm_gb"):
            v = getattr(self, field)
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"cluster {field}={v!r} must be a positive number, or None (the catalog's)")
            if v is not None:
                limits.check_real(field, v)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def server(self) -> catalog.Server:
        """The catalog's server row built around this GPU (e.g. DGX A100 for A100)."""
        return next(s for s in catalog.TABLES["server"] if s.gpu == self.gpu)

    @property
    def peak_flops(self) -> float:
        """Peak dense 16-bit FLOP/s of one GPU (catalog)."""
        return catalog.lookup("gpu", self.gpu).dense_16bit_tflops * 1e12

    @property
    def memory_bytes(self) -> float:
        return (self.hbm_gb or HBM_GB[self.gpu][0]) * 1e9

    @property
    def intra(self) -> MachineParams:
        """One GPU's NVLink bandwidth, per direction, and the NVLink latency: chapter 1's alpha, beta."""
        gbps = self.intra_GBps or catalog.lookup("nvlink", catalog.lookup("gpu", self.gpu).nvlink
                                                 ).gpu_GBps_per_direction
        return MachineParams(self.latencies.nvlink, 1e-9 / gbps)

    @property
    def inter(self) -> MachineParams:
        """One GPU's share of its server's NICs, per direction, and the network latency."""
        s = self.server
        gbps = self.inter_GBps or s.nics * s.nic_GBps_per_direction / s.gpus
        return MachineParams(self.latencies.network, 1e-9 / gbps)


KERNEL_MODELS = ("block", "parts")


@dataclass(frozen=True)
class Workload:
    """The global batch in sequences, and eta, the fraction of peak FLOP/s the block's kernels reach (None:
    the GPU type's measured value, `distlab.plan.efficiency.EFFICIENCY`). `kernels="parts"` prices each
    part of a step where it runs instead (`distlab.plan.kernel_time`: GEMMs by their size, attention by
    its kernel, memory-bound work and the optimizer step by bytes); an explicit `efficiency` overrides it."""

    batch: int
    efficiency: float | None = None
    kernels: str = "block"  # "block": one eta per GPU type; "parts": `plan.kernel_time` prices each part

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_MODELS:
            raise ValueError(f"kernels={self.kernels!r} is unknown; choose one of {', '.join(KERNEL_MODELS)}")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"batch={self.batch!r} must be a positive integer number of sequences, e.g. 512")
        limits.check_int("batch", self.batch, 1)
        e = self.efficiency
        if e is not None and (isinstance(e, bool) or not isinstance(e, (int, float))
                              or not limits.MIN_EFFICIENCY <= e <= 1):
            raise ValueError(f"efficiency={e!r} must be in [{limits.MIN_EFFICIENCY}, 1], the fraction of "
                             "peak FLOP/s the kernels reach, e.g. 0.5")

    def eta(self, gpu: str) -> float:
        """The efficiency to use on `gpu`: the one given, else the GPU type's measured one."""
        return self.efficiency if self.efficiency is not None else efficiency_for(gpu)
