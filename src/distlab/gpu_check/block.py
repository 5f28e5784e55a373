"""One transformer block's share on one GPU of a tensor-parallel group, timed: the kernels' efficiency eta.

Chapter 9's planner prices compute as FLOPs / (eta P). For the A100 it takes eta from a published block
time (Korthikanti et al. 2022, Table 4; `distlab.plan.efficiency`). This module measures eta on the GPU
at hand, the same way: the forward and backward of one block as one GPU of a group of t runs it (the
Megatron split of Shoeybi et al. 2019: its heads/t query heads and kv_heads/t key/value heads, its f/t
columns of the MLP), with no communication at all (the planner prices the tensor-parallel collectives as
a term of their own), and divides the planner's FLOPs for that block by the measured time and the peak:

    eta = 3 b s (2 W + 4 s h) / t / (P (t_forward + t_backward))

with W the block's matrix weights (`model_shape.block_weights`, grouped-query attention and gated MLPs
included) and P the catalog's dense 16-bit peak. Two blocks are timed: Korthikanti et al.'s 22B GPT
block (the block behind the A100's value, so the two GPUs are compared on the same work) and Llama 3
405B's (Dubey et al. 2024, Table 3: h 16,384, 128 heads, 8 KV heads, FFN 53,248, SwiGLU) at t = 8 and
s = 8,192, the shape the H100 runs of chapter 9 ran.

Attention is torch's `scaled_dot_product_attention` with the causal mask, which runs a fused kernel
(flash attention) on a recent GPU; the FLOPs count the full s x s products (4 s h per token), as the
planner does, so a causal kernel that skips the masked half raises eta. On the CPU the same code runs
(tiny shapes, for the tests); only a GPU's figure means anything.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from distlab import catalog, device_names
from distlab.model_shape import block_weights, kv_width
from distlab.timing import cuda_sync, phase_seconds


@dataclass(frozen=True)
class BlockShape:
    """A block as one GPU of a tensor-parallel group of `tp` holds it; micro-batch `batch` of `seq` tokens."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    gated: bool
    seq: int
    batch: int
    tp: int

    def __post_init__(self) -> None:
        for field in ("heads", "kv_heads", "ffn"):
            if getattr(self, field) % self.tp:
                raise ValueError(f"{field}={getattr(self, field)} is not divisible by tp={self.tp}; "
                                 "choose a tp that divides it")
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")

    def flops(self) -> float:
        """The planner's forward + backward FLOPs of this GPU's share: 3 b s (2 W + 4 s h) / t."""
        w = block_weights(self.hidden, self.heads, self.kv_heads, self.ffn, self.gated)
        return 3 * self.batch * self.seq * (2 * w + 4 * self.seq * self.hidden) / self.tp


# Korthikanti et al. 2022, Table 4's block (22B GPT: h 6144, 64 heads, s 2048, b 4, t 8) and Llama 3 405B's
# (Dubey et al. 2024, Table 3; t 8, s 8192, one sequence per micro-batch as in its Table 4).
SHAPES = (BlockShape("korthikanti-22b", 6144, 64, 64, 4 * 6144, False, 2048, 4, 8),
          BlockShape("llama3-405b", 16384, 128, 8, 53248, True, 8192, 1, 8))


def _weights(s: BlockShape, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
    """This GPU's share of the block's matrices (Megatron's column and row splits), scaled as at init."""
    h, d = s.hidden, s.hidden // s.heads
    q, kv, f = s.heads // s.tp * d, kv_width(h, s.heads, s.kv_heads) // s.tp, s.ffn // s.tp
    g = torch.Generator().manual_seed(0)

    def w(rows: int, cols: int) -> Tensor:
        t = torch.randn(rows, cols, generator=g) / math.sqrt(cols)
        return t.to(device, dtype).requires_grad_()

    out = {"qkv": w(q + 2 * kv, h), "proj": w(h, q), "up": w((2 if s.gated else 1) * f, h), "down": w(h, f)}
    return out | {"ln1": torch.ones(h, device=device, dtype=dtype, requires_grad=True),
                  "ln2": torch.ones(h, device=device, dtype=dtype, requires_grad=True)}


def block_forward(x: Tensor, w: dict[str, Tensor], s: BlockShape) -> Tensor:
    """Pre-norm block: x + proj(attention(norm(x))), then + down(mlp(norm(.))); causal attention."""
    b, n, h = x.shape
    d = h // s.heads
    a = F.rms_norm(x, (h,), w["ln1"]) @ w["qkv"].T
    q, k, v = a.split([s.heads // s.tp * d, s.kv_heads // s.tp * d, s.kv_heads // s.tp * d], dim=-1)
    q, k, v = (t.view(b, n, -1, d).transpose(1, 2) for t in (q, k, v))
    groups = s.heads // s.kv_heads  # each K/V head serves this many query heads (repeat_kv, as Llama's code)
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + att.transpose(1, 2).reshape(b, n, -1) @ w["proj"].T
    u = F.rms_norm(x, (h,), w["ln2"]) @ w["up"].T
    if s.gated:
        gate, up = u.chunk(2, dim=-1)
        u = F.silu(gate) * up
    else:
        u = F.gelu(u)
    return x + u @ w["down"].T


@dataclass(frozen=True)
class BlockTime:
    """What `time_block` measured: median milliseconds of the forward and of the backward, and eta."""

    name: str
    device: str
    dtype: str
    forward_ms: float
    backward_ms: float
    tflops: float
    peak_tflops: float | None
    eta: float | None
    repeats: int

    def to_dict(self) -> dict:
        return asdict(self)


def time_block(s: BlockShape, device: torch.device, dtype: torch.dtype = torch.bfloat16, repeats: int = 10,
               warmup: int = 3, gpu: str | None = None) -> BlockTime:
    """Median forward and backward times of `s` over `repeats` steps after `warmup`; eta against the peak
    of catalog GPU `gpu` (None: no eta)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats}, warmup={warmup}: need repeats >= 1 and warmup >= 0")
    w = _weights(s, device, dtype)
    x = torch.randn(s.batch, s.seq, s.hidden, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    x.requires_grad_()
    held: dict[str, torch.Tensor] = {}

    def forward() -> None:
        held["y"] = block_forward(x, w, s)

    def backward() -> None:
        held["y"].backward(torch.ones_like(held["y"]))

    def clear() -> None:
        for t in (x, *w.values()):
            t.grad = None
        held.clear()

    times = phase_seconds([forward, backward], repeats, warmup=warmup, sync=cuda_sync(device), after=clear)
    f_ms, b_ms = (1e3 * statistics.median(phase) for phase in zip(*times, strict=True))
    tflops = s.flops() / ((f_ms + b_ms) * 1e-3) / 1e12
    peak = catalog.lookup("gpu", gpu).dense_16bit_tflops if gpu else None
    return BlockTime(s.name, str(device), str(dtype).removeprefix("torch."), round(f_ms, 3), round(b_ms, 3),
                     round(tflops, 1), peak, round(tflops / peak, 3) if peak else None, repeats)


def catalog_gpu(name: str) -> str | None:
    """The catalog's GPU type for a device name such as 'NVIDIA H100 80GB HBM3' (None: not in the catalog;
    `device_names.gpu_for_device` says how names are matched)."""
    row = device_names.gpu_for_device(name)
    return None if row is None else row.name


def block_efficiency(device: int = 0, repeats: int = 10) -> list[dict]:
    """`time_block` for every shape in SHAPES on CUDA GPU `device`, as report rows."""
    dev = torch.device("cuda", device)
    gpu = catalog_gpu(torch.cuda.get_device_name(dev))
    return [time_block(s, dev, repeats=repeats, gpu=gpu).to_dict() for s in SHAPES]
