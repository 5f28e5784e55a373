"""Scaling an FP8 tensor: how many numbers share one scale, and where the scale comes from.

A tensor x is stored as q = cast(x * s) with a float32 scale s chosen so that the largest |x| of the group
lands at the format's largest number: s = max_fp8 / amax (Micikevicius et al. 2022, sec. 4.3, "per-tensor
scaling"); x is read back as q / s. The granularity is the group that shares one s, written here as a
block shape (rows, cols) of the 2-D tensor, None meaning the whole dimension:

- **tensorwise** (None, None): one scale for the tensor (Transformer Engine, torchao's "tensorwise");
- **rowwise**: one scale per slice along the matmul's contraction dimension, (1, None) for the left
  operand of A @ B and (None, 1) for the right one (torchao's "rowwise", axiswise scaling);
- **blockwise**: DeepSeek-V3's fine-grained quantisation (DeepSeek-AI 2024, arXiv:2412.19437, sec. 3.3.2):
  activations and gradients in 1 x 128 tiles along the contraction dimension (per token per 128
  channels), weights in 128 x 128 blocks.

The scale itself is *current* (computed from this tensor's amax now, one extra pass over it) or *delayed*:
`DelayedScaling` keeps the amax of the last `history` steps and scales this step's tensor with their
maximum, so the cast needs no pass of its own (Micikevicius et al. 2022, sec. 4.3; NVIDIA Transformer
Engine's amax history). A delayed scale is stale: when this step's amax exceeds the history's, values
above max_fp8 / s saturate, an *overflow*. Values that round to zero are *underflows*. `quantize` counts
both, and the *non-finite* inputs (inf, NaN) apart.

Non-finite inputs (one inf in an activation, a NaN gradient) must not take the scale with them. Current
scaling takes its amax over the finite values only: the finite ones are cast as well as ever, an inf
saturates at +-max (one overflow, one non-finite) and a NaN stays NaN. Delayed scaling keeps the last good
scale: a non-finite amax never enters the history, and if the amax a scale would come from is not finite
(a tensor's first cast, with no history) the scale used before is kept (1 before any), which is Transformer
Engine's rule for delayed scaling (`_default_sf_compute` in transformer_engine/pytorch/fp8.py keeps the
previous scale when the amax is 0, inf or NaN). TE records the non-finite amax in its history, so its
scale stays frozen for `amax_history_len` steps; leaving it out lets the scale follow the finite
amaxes again from the next step. Without either rule, s = max_fp8 / inf = 0 and every later cast of the
tensor reads back 0 / 0 = NaN for `history` steps, though its inputs are finite.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from distlab.memory.fp8.formats import Fp8Format, fp8_format

GRANULARITIES = ("tensorwise", "rowwise", "blockwise")
TILE = 128  # DeepSeek-V3's tile and block edge (sec. 3.3.2)
EPS = 1e-12  # the smallest amax a scale is computed from (torchao's float8_utils.EPS), so 0 gives no inf

Block = tuple[int | None, int | None]


def check_granularity(granularity: str) -> str:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is unknown; choose one of {', '.join(GRANULARITIES)}")
    return granularity


def operand_block(granularity: str, contraction_dim: int, weight: bool = False, tile: int = TILE) -> Block:
    """The block of one matmul operand: `contraction_dim` is 1 for the left operand A (M x K) of A @ B and
    0 for the right one B (K x N); `weight` picks DeepSeek-V3's 128 x 128 weight blocks."""
    check_granularity(granularity)
    if granularity == "tensorwise":
        return (None, None)
    if granularity == "blockwise" and weight:
        return (tile, tile)
    along = None if granularity == "rowwise" else tile
    return (1, along) if contraction_dim == 1 else (along, 1)


def _grid(x: Tensor, block: Block) -> tuple[int, int, int, int]:
    r, c = x.shape
    br, bc = block[0] or r, block[1] or c
    return br, bc, -(-r // br), -(-c // bc)


def block_amax(x: Tensor, block: Block) -> Tensor:
    """max |x| of every block of the 2-D tensor x: a (ceil(rows / br), ceil(cols / bc)) float32 tensor.
    Edge blocks are padded with zeros, which never raise an amax."""
    if x.dim() != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; quantise a 2-D tensor (reshape to (-1, last dim))")
    br, bc, nr, nc = _grid(x, block)
    a = x.detach().abs().float()
    a = torch.nn.functional.pad(a, (0, nc * bc - a.shape[1], 0, nr * br - a.shape[0]))
    return a.view(nr, br, nc, bc).amax(dim=(1, 3))


def finite_amax(x: Tensor, block: Block) -> Tensor:
    """`block_amax` over the finite values only (inf and NaN read as 0): what current scaling scales by."""
    a = x.detach().float()
    return block_amax(torch.where(torch.isfinite(a), a, torch.zeros_like(a)), block)


def amax_to_scale(amax: Tensor, fmt: Fp8Format, power_of_2: bool = False) -> Tensor:
    """s = max_fp8 / amax, computed in float64 and rounded to float32 (as torchao's `amax_to_scale`);
    `power_of_2` rounds s down to a power of two, so that x * s and q / s are exact."""
    s = (fmt.max / torch.clamp(amax.to(torch.float64), min=EPS)).to(torch.float32)
    return torch.exp2(torch.floor(torch.log2(s))) if power_of_2 else s


def _expand(s: Tensor, x: Tensor, block: Block) -> Tensor:
    br, bc, _, _ = _grid(x, block)
    return s.repeat_interleave(br, 0)[: x.shape[0]].repeat_interleave(bc, 1)[:, : x.shape[1]]


@dataclass
class Quantized:
    """An FP8 tensor: `data` (the FP8 bits), its `scale` per block of shape `block`, and what the cast lost:
    `overflow` (values saturated at the format's max, an inf among them) and `underflow` (nonzero values
    rounded to 0); `nonfinite` counts the inputs that were inf or NaN."""

    data: Tensor
    scale: Tensor
    block: Block
    overflow: int
    underflow: int
    nonfinite: int = 0

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """q / s in float32 (a division, as torchao's emulation does), then cast to `dtype`."""
        return (self.data.float() / _expand(self.scale, self.data, self.block)).to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the FP8 data and the float32 scales together."""
        return self.data.numel() * self.data.element_size() + self.scale.numel() * 4


def quantize(x: Tensor, fmt: Fp8Format | str, block: Block = (None, None), scale: Tensor | None = None,
             power_of_2: bool = False) -> Quantized:
    """Cast the 2-D tensor x to FP8 with one scale per `block`: the given `scale` (delayed scaling) or
    max_fp8 / amax of each block's finite values now (current scaling). Saturates at +-max (torchao's
    `to_fp8_saturated`): an inf input becomes +-max and counts as an overflow; a NaN stays NaN."""
    fmt = fmt if isinstance(fmt, Fp8Format) else fp8_format(fmt)
    s = amax_to_scale(finite_amax(x, block), fmt, power_of_2) if scale is None else scale.float()
    scaled = x.float() * _expand(s, x, block)
    over = int((scaled.abs() >= fmt.max + fmt.step_at(fmt.max) / 2).sum())  # would round above max
    q = scaled.clamp(-fmt.max, fmt.max).to(fmt.torch_dtype)
    under = int(((q.float() == 0) & (x != 0)).sum())
    return Quantized(q, s, block, over, under, int((~torch.isfinite(x)).sum()))


def fake_quantize(x: Tensor, fmt: Fp8Format | str, block: Block = (None, None), power_of_2: bool = False
                  ) -> Tensor:
    """x quantised to FP8 and read back, in x's dtype and shape (leading dims folded into rows)."""
    flat = x.reshape(-1, x.shape[-1])
    return quantize(flat, fmt, block, power_of_2=power_of_2).dequantize(x.dtype).view(x.shape)


@dataclass
class DelayedScaling:
    """Per-tensor delayed scaling: each named tensor's scale comes from the largest amax of its last
    `history` casts (Micikevicius et al. 2022, sec. 4.3), and `margin` powers of two of headroom. The first
    cast of a tensor, with no history yet, uses its current amax. A non-finite amax is left out of the
    history, and a scale that would come from one is replaced by the last good scale (module docstring)."""

    history: int = 16
    margin: int = 0
    amax_history: dict[str, deque] = field(default_factory=dict)
    last_scale: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.history, bool) or not isinstance(self.history, int) or self.history < 1:
            raise ValueError(f"history={self.history!r} must be a positive number of steps, e.g. 16")

    def scale(self, name: str, x: Tensor, fmt: Fp8Format) -> Tensor:
        """The scale for this cast of tensor `name` (from the history), then record x's amax in it."""
        now = block_amax(x, (None, None))
        past = self.amax_history.setdefault(name, deque(maxlen=self.history))
        amax = torch.stack(list(past)).amax(0) if past else now
        if bool(torch.isfinite(now).all()):
            past.append(now)
        if not bool(torch.isfinite(amax).all()):
            return self.last_scale.get(name, torch.ones_like(amax))
        self.last_scale[name] = amax_to_scale(amax, fmt) / 2.0**self.margin
        return self.last_scale[name]
