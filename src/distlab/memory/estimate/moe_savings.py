"""DeepSeek-V3's two activation savings, as options of the MoE activation estimate (`moe_activations`).

DeepSeek-AI 2024 (arXiv:2412.19437) keeps its activations inside an 80 GB H800 with no tensor parallelism by

- **recomputation** (sec. 3.2.3, "Recomputation of RMSNorm and MLA Up-Projection"): every RMSNorm and
  every up-projection of multi-head latent attention runs again in backward, so their outputs are not
  stored: the norms' outputs (the inputs of the down-projections, of the router and of the experts' first
  layers), the query and key-value latents' norms' outputs, and q, k and v. What remains is what the
  recomputation starts from: the norms' inputs and the two latents (with the shared rope key);
- **FP8 activation caching** (sec. 3.3.3, "Low-Precision Storage and Communication"): the input of each
  linear layer is cached in FP8 for its backward, with one scale per 1 x 128 tile of activations (its
  fine-grained quantization, sec. 3.3.2: 1 + 4/128 bytes a value); two exceptions: the input of the linear
  layer after attention (the attention output, which attention's backward also reads) is kept in the
  customised 12-bit E5M6 format (1.5 bytes), and the MoE's SwiGLU caches its two inputs in FP8 and
  recomputes its output in backward (so the down-projection's input is not stored at all). We apply the
  SwiGLU rule to the shared experts too (they are the MoE layer's), and to the dense layers' SwiGLU only
  the linear-input rule (their product in FP8); the router's probabilities and the combine's rows stay as
  they are. The router, an MoE gating module, keeps its original precision (sec. 3.3.1: so do the
  embedding, the output head, the norms and attention), so it keeps its own BF16 copy of the norm's output
  beside the FP8 copy the experts read (`router_input`): T h e a layer, which the estimate missed until
  chapter 12's dry run of a whole stage with FP8 caching found it (+3.4 % on DeepSeek-V3's stage 1).

Both are off by default, so that the estimate with nothing recomputed stays the one tested against chapter 6's
block (`moe_block_activations.GENERIC`); `DEEPSEEK_V3_SAVINGS` turns both on.
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_BYTES = 1 + 4 / 128  # an E4M3 value and its share of the 1 x 128 tile's fp32 scale (sec. 3.3.2)
E5M6_BYTES = 1.5  # 12 bits (sec. 3.3.3)


@dataclass(frozen=True)
class Savings:
    """Which of DeepSeek-V3's savings the estimate applies (module docstring)."""

    recompute: bool = False  # RMSNorms and MLA up-projections recomputed in backward (sec. 3.2.3)
    fp8: bool = False  # linear inputs in FP8; SwiGLU's inputs in FP8, its output recomputed (sec. 3.3.3)

    def __post_init__(self) -> None:
        for name in ("recompute", "fp8"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")

    def linear_input(self, e: float) -> float:
        """Bytes per value of a cached linear-layer input."""
        return FP8_BYTES if self.fp8 else e

    def attention_output(self, e: float) -> float:
        """Bytes per value of the attention output (the output projection's input)."""
        return E5M6_BYTES if self.fp8 else e

    def norm_output(self, e: float) -> float:
        """Bytes per value of a norm's output (a linear layer's input): none when recomputed."""
        return 0.0 if self.recompute else self.linear_input(e)

    def router_input(self, e: float) -> float:
        """Bytes per value of the router's own copy of the MoE norm's output (module docstring): BF16 under
        FP8 caching; none when the norm is recomputed, or without FP8 (one copy, the norm's output)."""
        return e if self.fp8 and not self.recompute else 0.0

    def up_projection(self, e: float) -> float:
        """Bytes per value of MLA's q, k and v (the up-projections' outputs): none when recomputed."""
        return 0.0 if self.recompute else e

    def swiglu(self, e: float, width: float, moe: bool) -> float:
        """Bytes per token of a SwiGLU of `width`, unfused: the gate and up outputs, the SiLU's output and
        the product (the down-projection's input); in an MoE layer under FP8 only the two inputs, in FP8,
        the rest recomputed."""
        if self.fp8 and moe:
            return 2 * width * FP8_BYTES
        return 3 * width * e + width * self.linear_input(e)


NONE = Savings()
DEEPSEEK_V3_SAVINGS = Savings(recompute=True, fp8=True)
