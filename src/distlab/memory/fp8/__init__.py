"""FP8 training from scratch (chapter 7, after mixed precision): the formats, scaling, an FP8 linear layer,
parameters all-gathered in FP8, and when it pays.

One idea per file:
- `formats`: E4M3 and E5M2 from their bit layouts (Micikevicius et al. 2022): range, step, subnormals,
  checked against `torch.finfo` and against all 256 patterns torch decodes.
- `scaling`: `quantize` with one scale per tensor, per row or per block (DeepSeek-V3's 1 x 128 tiles and
  128 x 128 blocks), current or delayed (`DelayedScaling`, an amax history); overflow and underflow counts.
- `linear`: `Fp8Linear` in emulation (quantise, matmul in float32; forward E4M3, gradients E5M2),
  `Fp8Recipe` (torchao's "tensorwise" and "rowwise" recipes too), `convert_to_fp8`, `fp8_stats`.
- `compare`: the granularities on the course's GPT, each one's error against bf16 on the same step.
- `allgather`: ZeRO-3 parameters all-gathered in FP8 with their scales, and the bytes it sends.
- `cost_model`: the time of a linear layer in bf16 and in FP8 with its casts, on an H100; `figures`: the
  chapter's FP8 pictures.
"""

from distlab.memory.fp8.allgather import fp8_all_gather, gather_bytes, shard_rows
from distlab.memory.fp8.cost_model import break_even, linear_times, speedup
from distlab.memory.fp8.formats import E4M3, E5M2, FORMATS, Fp8Format, check_against_torch, fp8_format
from distlab.memory.fp8.linear import Fp8Linear, Fp8Recipe, convert_to_fp8, fp8_stats
from distlab.memory.fp8.scaling import DelayedScaling, Quantized, fake_quantize, operand_block, quantize

__all__ = [
    "E4M3", "E5M2", "FORMATS", "DelayedScaling", "Fp8Format", "Fp8Linear", "Fp8Recipe", "Quantized",
    "break_even", "check_against_torch", "convert_to_fp8", "fake_quantize", "fp8_all_gather", "fp8_format",
    "fp8_stats", "gather_bytes", "linear_times", "operand_block", "quantize", "shard_rows", "speedup",
]
