"""Published MoE training runs as data: shape, layout, batch, sequence and reported throughput, each row
with its source (DeepSeek-AI 2024; Liu et al. 2025; NVIDIA Megatron-Core and Megatron-Bridge).

These rows are what a planner of MoE layouts is judged against; nothing here predicts anything.
`published_counts` derives from them what needs no model of the machine: parameters (total, and active
per token), data-parallel sizes, experts per rank and where an expert-parallel group lies.

Sizes follow Megatron-Core's names: attention is split tp x cp x dp x pp and the experts etp x ep x edp
x pp over the same GPUs (parallel folding). A field the source does not give is None, and the row's
`note` says so; nothing is filled in by guess. `global_batch` counts sequences of `seq_len` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.model_shape import ModelShape
from distlab.moe_shape import MLA, MoEShape

__all__ = ["MLA", "PUBLISHED_RUNS", "PublishedRun", "PublishedShape", "run"]


@dataclass(frozen=True)
class PublishedShape:
    """A published MoE transformer's shape, as far as counting its parameters needs (the data of these
    rows, not the planner's model shape). FFNs are SwiGLU (three matrices of hidden x width). The first
    `dense_layers` layers have a dense FFN of width `dense_ffn`; the others route each token to `top_k` of
    `experts` routed experts of width `expert_ffn`, beside `shared_experts` always-on experts of width
    `shared_ffn` each. `mla` None means grouped-query attention with `kv_heads` heads of `head_dim`.
    `published_total` and `published_active`: the publisher's counts, in parameters."""

    layers: int
    hidden: int
    vocab: int
    heads: int
    head_dim: int
    experts: int
    top_k: int
    expert_ffn: int
    kv_heads: int | None = None
    dense_layers: int = 0
    dense_ffn: int = 0
    shared_experts: int = 0
    shared_ffn: int = 0
    shared_gate: bool = False  # a sigmoid gate on the shared expert (Qwen2-MoE): hidden weights
    qkv_bias: bool = False
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (Qwen3)
    tied_embeddings: bool = False
    mla: MLA | None = None
    published_total: float | None = None
    published_active: float | None = None
    source: str = ""

    def model_shape(self, seq: int = 4096) -> ModelShape:
        """The course's one `ModelShape` of this model (SwiGLU, RMSNorm, no biases, no learned positions;
        sequences of `seq`), whose `params` and `active_params` are the counts (`distlab.moe_shape`)."""
        moe = MoEShape(experts=self.experts, top_k=self.top_k, expert_ffn=self.expert_ffn,
                       shared_experts=self.shared_experts, shared_ffn=self.shared_ffn or None,
                       shared_gate=self.shared_gate, dense_layers=self.dense_layers, head_dim=self.head_dim,
                       qkv_bias=self.qkv_bias, qk_norm=self.qk_norm, mla=self.mla)
        return ModelShape(layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=self.vocab, seq=seq,
                          kv_heads=self.kv_heads, ffn=self.dense_ffn or None, gated=True,
                          tied=self.tied_embeddings, positions=False, bias=False, moe=moe)


@dataclass(frozen=True)
class PublishedRun:
    """One published training run: where it ran, how it was laid out, and what it reported."""

    name: str
    model: str
    source: str  # the citation: document, section or table, version
    gpu: str
    gpus: int | None
    gpus_per_node: int
    precision: str | None
    seq_len: int | None
    global_batch: int | None
    micro_batch: int | None
    tp: int | None
    cp: int | None
    pp: int | None
    ep: int | None
    etp: int | None = None
    vp: int | None = None
    data_parallel: str | None = None  # "ZeRO-1", "distributed optimizer", "DDP", ...
    pipeline: str | None = None  # "DualPipe", "interleaved 1F1B", ...
    dispatch: str | None = None  # "dropless", "token drop", with routing notes
    gradient_accumulation: int | None = None
    tokens_per_s_per_gpu: float | None = None
    model_tflops_per_gpu: float | None = None
    mfu: float | None = None
    gpu_hours_per_trillion_tokens: float | None = None
    shape: PublishedShape | None = None
    note: str = ""


# DeepSeek-V3 (DeepSeek-AI 2024, arXiv 2412.19437): sec. 4.2 (61 layers, hidden 7168, 128 heads of 128,
# MLA ranks 1536 / 512 and rope 64, first 3 layers dense, 1 shared + 256 routed experts of 2048, top-8,
# at most 4 nodes per token), the released config (dense FFN 18432, vocab 129,280, untied head) and the
# weights' README (671B total, 36.7B activated incl. 0.9B embedding and 0.9B head; the MTP module's 11.5B
# are extra). Checked with the search tool in the DeepSeek-V3 repository and quotes of the report.
DEEPSEEK_V3 = PublishedShape(
    layers=61, hidden=7168, vocab=129_280, heads=128, head_dim=128, experts=256, top_k=8, expert_ffn=2048,
    dense_layers=3, dense_ffn=18_432, shared_experts=1, shared_ffn=2048,
    mla=MLA(q_rank=1536, kv_rank=512, qk_nope=128, qk_rope=64, v_dim=128),
    published_total=671e9, published_active=36.7e9,
    source="DeepSeek-AI 2024 sec. 4.2; DeepSeek-V3 config_671B.json and README_WEIGHTS.md")

# Qwen3-30B-A3B (Qwen team 2025, arXiv 2505.09388, its MoE architecture table: 48 layers, 32 query / 4
# key-value heads, 128 experts, 8 active; the released config.json: hidden 2048, head_dim 128, expert FFN
# 768, vocab 151,936, untied, q/k norms; 30.5B total, 3.3B activated). The config was checked in copies
# of it found with the search tool (Megatron-Bridge tests, MindSpeed's Qwen3 config), the counts in
# vLLM-Ascend's model page.
QWEN3_30B_A3B = PublishedShape(
    layers=48, hidden=2048, vocab=151_936, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8,
    expert_ffn=768, qk_norm=True, published_total=30.5e9, published_active=3.3e9,
    source="Qwen3 technical report; Qwen/Qwen3-30B-A3B config.json; 30.5B / 3.3B as vLLM-Ascend quotes")

# Qwen2-57B-A14B (Qwen team 2024, arXiv 2407.10671; released config.json: 28 layers, hidden 3584, 28 /
# 4 heads, 64 experts of 2560, top-8, one gated shared expert of 20480, qkv bias, vocab 151,936, untied).
QWEN2_57B_A14B = PublishedShape(
    layers=28, hidden=3584, vocab=151_936, heads=28, kv_heads=4, head_dim=128, experts=64, top_k=8,
    expert_ffn=2560, shared_experts=1, shared_ffn=20_480, shared_gate=True, qkv_bias=True,
    published_total=57e9, published_active=14e9,
    source="Qwen2 technical report; Qwen/Qwen2-57B-A14B config.json")

_FOLDING = ("Liu et al. 2025 (arXiv 2504.14960), abstract: up to 49.3 % MFU for Mixtral 8x22B and "
            "39.0 % for Qwen2-57B-A14B on H100, scaling to 1,024 GPUs. ")
_NOT_FOUND = ("The paper's table of layouts was not reachable with the search tool (only its abstract), so "
              "TP/EP/ETP/PP/CP/DP, batch, sequence and GPU count are None rather than guessed.")
_BRIDGE = "NVIDIA Megatron-Bridge docs/performance-summary.md, "
_FORCED = " The benchmarks force-balance the tokens over the experts (the summary's note)."

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    # DeepSeek-AI 2024 sec. 3.1-3.2 (2,048 H800 in nodes of 8; 16-way PP with DualPipe, 64-way EP over 8
    # nodes, ZeRO-1 DP, no TP), sec. 4.2 (sequence 4K; batch 3,072 -> 15,360 sequences over the first
    # 469B tokens, then 15,360), sec. 1 (180K H800 GPU hours per trillion tokens), sec. 3.3 (FP8 mixed
    # precision). Layout as the issue quotes the report; batch and GPU hours checked in quotes of it.
    PublishedRun(
        "deepseek-v3", "DeepSeek-V3", "DeepSeek-AI 2024 (arXiv 2412.19437) secs. 1, 3.2, 4.2",
        gpu="H800", gpus=2048, gpus_per_node=8, precision="FP8 mixed", seq_len=4096, global_batch=15_360,
        micro_batch=None, tp=1, cp=1, pp=16, ep=64, etp=1, data_parallel="ZeRO-1", pipeline="DualPipe",
        dispatch="dropless, node-limited (M = 4 nodes per token), aux-loss-free balancing",
        gpu_hours_per_trillion_tokens=180e3, shape=DEEPSEEK_V3,
        note="global_batch is the batch after the first 469B tokens (3,072 before, ramped); micro-batch "
             "size is not given. Throughput is given as GPU hours per trillion tokens (180K H800 hours, "
             "3.7 days on 2,048 GPUs), no MFU."),
    PublishedRun(
        "folding-mixtral-8x22b", "Mixtral 8x22B", "Liu et al. 2025 (arXiv 2504.14960)", gpu="H100",
        gpus=None, gpus_per_node=8, precision=None, seq_len=None, global_batch=None, micro_batch=None,
        tp=None, cp=None, pp=None, ep=None, mfu=0.493,
        note=_FOLDING + _NOT_FOUND + " Its shape is not given either (not checked in a primary source)."),
    PublishedRun(
        "folding-qwen2-57b-a14b", "Qwen2-57B-A14B", "Liu et al. 2025 (arXiv 2504.14960)", gpu="H100",
        gpus=None, gpus_per_node=8, precision=None, seq_len=None, global_batch=None, micro_batch=None,
        tp=None, cp=None, pp=None, ep=None, mfu=0.390, shape=QWEN2_57B_A14B, note=_FOLDING + _NOT_FOUND),
    # Megatron-Core's MoE README (megatron/core/transformer/moe/README.md), "Reference Best Parallel
    # Mapping" of MCore v0.8: 128 H100 (8 per server, NVLink 4, 8 x 400 Gb/s InfiniBand), dropless
    # all-to-all, BF16, sequence 4096, TP 4, EP 2, PP 8, VP 7, MBS 1, GBS 256. No throughput given.
    PublishedRun(
        "mcore-mixtral-8x22b", "Mixtral 8x22B", "Megatron-Core MoE README, reference mapping (MCore v0.8)",
        gpu="H100", gpus=128, gpus_per_node=8, precision="BF16", seq_len=4096, global_batch=256,
        micro_batch=1, tp=4, cp=1, pp=8, ep=2, vp=7, data_parallel="distributed optimizer",
        dispatch="dropless all-to-all",
        note="A layout without a throughput: the README gives none for this mapping. ETP is not given "
             "(MCore v0.8 split experts with the attention's TP)."),
    # Megatron-Bridge performance summary, 25.09 container, DGX-H100 table: DeepSeekV3 (dropless), 1,024
    # GPUs, GBS 8192, MBS 1, sequence 4096, TP 2, PP 8, CP 1, VP 4, EP 64, GA 128, 1,297 tokens/s/GPU,
    # 338 model TFLOP/s/GPU (330 with the 128 x 128 / 1 x 128 FP8 scaling of the original pre-training).
    PublishedRun(
        "bridge-deepseek-v3-h100", "DeepSeek-V3", _BRIDGE + "25.09 container, DGX-H100", gpu="H100",
        gpus=1024, gpus_per_node=8, precision=None, seq_len=4096, global_batch=8192, micro_batch=1, tp=2,
        cp=1, pp=8, ep=64, etp=1, vp=4, dispatch="dropless", gradient_accumulation=128,
        tokens_per_s_per_gpu=1297, model_tflops_per_gpu=338, shape=DEEPSEEK_V3,
        note="The 25.09 table has no precision column (its note on FP8 scaling granularities implies FP8). "
             "ETP 1 is from the recipe, scripts/performance/configs/deepseek/"
             "deepseek_workload_base_configs.py (expert_tensor_parallel_size=1; H100: TP 2, PP 8, VP 4, EP "
             "64, GBS 8192), not from the table." + _FORCED),
    # Same summary, 26.02 container, DGX-B200 table: DeepSeekV3, 256 GPUs, FP8-MX, GBS 4096, MBS 1,
    # sequence 4096, FSDP 0, TP 1, PP 16, CP 1, VP n/a, EP 8, GA 256, 2,689 tokens/s/GPU, 699 TFLOP/s/GPU.
    PublishedRun(
        "bridge-deepseek-v3-b200", "DeepSeek-V3", _BRIDGE + "26.02 container, DGX-B200", gpu="B200",
        gpus=256, gpus_per_node=8, precision="FP8-MX", seq_len=4096, global_batch=4096, micro_batch=1,
        tp=1, cp=1, pp=16, ep=8, etp=1, data_parallel="DDP", dispatch="dropless", gradient_accumulation=256,
        tokens_per_s_per_gpu=2689, model_tflops_per_gpu=699, shape=DEEPSEEK_V3,
        note="ETP is 1 because TP is 1." + _FORCED),
    # Same summary, 26.02 container, DGX-H100 table: Qwen3_30B_a3B, 16 GPUs, FP8-CS, GBS 1024, MBS 1,
    # sequence 4096, FSDP 0, TP 1, PP 2, CP 1, VP 12, EP 8, GA 128, 2,557 tokens/s/GPU, 118 TFLOP/s/GPU.
    PublishedRun(
        "bridge-qwen3-30b-a3b-h100", "Qwen3-30B-A3B", _BRIDGE + "26.02 container, DGX-H100", gpu="H100",
        gpus=16, gpus_per_node=8, precision="FP8-CS", seq_len=4096, global_batch=1024, micro_batch=1, tp=1,
        cp=1, pp=2, ep=8, etp=1, vp=12, data_parallel="DDP", dispatch="dropless", gradient_accumulation=128,
        tokens_per_s_per_gpu=2557, model_tflops_per_gpu=118, shape=QWEN3_30B_A3B,
        note="ETP is 1 because TP is 1." + _FORCED),
)


def run(name: str) -> PublishedRun:
    """The row called `name`, or a ValueError listing the names there are."""
    for r in PUBLISHED_RUNS:
        if r.name == name:
            return r
    raise ValueError(f"no published run named {name!r}; choose one of "
                     f"{', '.join(r.name for r in PUBLISHED_RUNS)}")
