"""An FP8 linear layer in emulation: quantise, multiply in float32, and the result is what an FP8 GEMM with
float32 accumulation gives (Micikevicius et al. 2022, sec. 4; torchao's `Float8Linear(emulate=True)`).

y = x W^T + b runs three matmuls, and each casts both of its operands to FP8 first (`Fp8Recipe`):

    forward      y      = q(x)  q(W)^T           x, W in the forward format (E4M3)
    backward     dx     = q(dy) q(W)             dy in the gradient format (E5M2)
                 dW     = q(dy)^T q(x)

Every operand is scaled along its matmul's contraction dimension (`scaling.operand_block`), so that one
scale per output row and one per output column could be pulled out of the sum: per token for x and dy in
the first two, per output and input channel for W, per channel over the tokens for dW's operands. The bias
is added in the high precision. `save_fp8` keeps the forward's FP8 copy of x for the backward instead of x
itself (DeepSeek-V3, arXiv:2412.19437, sec. 3.3.3: the cached inputs of the linear layers in FP8), half the
saved bytes of a 16-bit x; for a granularity other than tensorwise, dW then re-quantises that copy along
the tokens (DeepSeek-V3's 1 x 128 to 128 x 1 tiles). Each layer counts, per operand role, the values each
cast saturated (overflow), flushed to zero (underflow) and received as inf or NaN (nonfinite) in `stats`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from distlab.memory.fp8.formats import Fp8Format, fp8_format
from distlab.memory.fp8.scaling import (
    DelayedScaling,
    Quantized,
    check_granularity,
    operand_block,
    quantize,
)

ROLES = ("input", "weight", "grad_output")


@dataclass(frozen=True)
class Fp8Recipe:
    """How a layer casts: the scaling `granularity`, the forward and gradient formats, scales rounded down to
    powers of two or not, and `delayed` (per-tensor delayed scaling; None: current scaling)."""

    granularity: str = "tensorwise"
    forward_format: str = "e4m3"
    grad_format: str = "e5m2"
    power_of_2: bool = False
    delayed: DelayedScaling | None = None
    save_fp8: bool = False

    def __post_init__(self) -> None:
        check_granularity(self.granularity)
        fp8_format(self.forward_format), fp8_format(self.grad_format)
        if self.delayed is not None and self.granularity != "tensorwise":
            raise ValueError(f"delayed scaling keeps one amax history per tensor; granularity="
                             f"{self.granularity!r} needs current scaling (delayed=None) or 'tensorwise'")

    @classmethod
    def torchao(cls, name: str) -> Fp8Recipe:
        """torchao's recipe `name` (torchao/float8/config.py): "tensorwise" (E4M3 forward, E5M2 gradients)
        or "rowwise" (E4M3 for all three, scales rounded down to powers of two)."""
        if name == "tensorwise":
            return cls()
        if name == "rowwise":
            return cls("rowwise", grad_format="e4m3", power_of_2=True)
        raise ValueError(f"recipe={name!r} is not one of torchao's emulated recipes; choose 'tensorwise' or "
                         "'rowwise'")


class _Cast:
    """One layer's casts under a recipe, counting what each role lost."""

    def __init__(self, layer: Fp8Linear) -> None:
        self.layer, self.recipe = layer, layer.recipe

    def __call__(self, x: Tensor, role: str, fmt: Fp8Format, contraction_dim: int) -> Quantized:
        r = self.recipe
        block = operand_block(r.granularity, contraction_dim, weight=role == "weight")
        scale = None if r.delayed is None else r.delayed.scale(f"{self.layer.fp8_name}.{role}", x, fmt)
        q = quantize(x, fmt, block, scale, r.power_of_2)
        s = self.layer.stats[role]
        s["overflow"] += q.overflow
        s["underflow"] += q.underflow
        s["nonfinite"] += q.nonfinite
        s["numel"] += x.numel()
        return q


class _Fp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, cast: _Cast) -> Tensor:  # type: ignore[override]
        r = cast.recipe
        fwd, grad = fp8_format(r.forward_format), fp8_format(r.grad_format)
        x2 = x.reshape(-1, x.shape[-1])
        qx = cast(x2, "input", fwd, 1)
        qw = cast(weight.detach().t(), "weight", fwd, 0)
        out = qx.dequantize() @ qw.dequantize()
        ctx.cast, ctx.formats, ctx.shape, ctx.dtype = cast, (fwd, grad), x.shape, x.dtype
        if r.save_fp8:
            ctx.block = qx.block
            ctx.save_for_backward(qx.data, qx.scale, weight)
        else:
            ctx.save_for_backward(x2, weight)
        return out.to(x.dtype).view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, dy: Tensor):  # type: ignore[override]
        cast, (fwd, grad) = ctx.cast, ctx.formats
        if cast.recipe.save_fp8:
            data, scale, weight = ctx.saved_tensors
            saved = Quantized(data, scale, ctx.block, 0, 0)
            x2 = saved.dequantize()
        else:
            x2, weight = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        qw = cast(weight.detach(), "weight", fwd, 0)
        dx = cast(dy2, "grad_output", grad, 1).dequantize() @ qw.dequantize()
        if cast.recipe.save_fp8 and cast.recipe.granularity == "tensorwise":
            qx = saved  # one scale for the tensor: the forward's copy serves dW as it is
        else:
            qx = cast(x2, "input", fwd, 0)
        dw = cast(dy2.t(), "grad_output", grad, 1).dequantize() @ qx.dequantize()
        return dx.to(ctx.dtype).view(ctx.shape), dw.to(weight.dtype), None


class Fp8Linear(nn.Linear):
    """`nn.Linear` whose three matmuls run in emulated FP8 under `recipe` (module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 recipe: Fp8Recipe | None = None, name: str = "linear") -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.recipe = recipe or Fp8Recipe()
        self.fp8_name = name
        self.stats = {role: {"overflow": 0, "underflow": 0, "nonfinite": 0, "numel": 0} for role in ROLES}

    def forward(self, x: Tensor) -> Tensor:
        y = _Fp8Matmul.apply(x, self.weight, _Cast(self))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    @classmethod
    def from_linear(cls, mod: nn.Linear, recipe: Fp8Recipe, name: str = "linear") -> Fp8Linear:
        """An Fp8Linear that shares `mod`'s weight and bias (the parameters are the same objects)."""
        with torch.device("meta"):
            new = cls(mod.in_features, mod.out_features, bias=False, recipe=recipe, name=name)
        new.weight, new.bias = mod.weight, mod.bias
        return new


def convert_to_fp8(model: nn.Module, recipe: Fp8Recipe, skip: tuple[str, ...] = ()) -> nn.Module:
    """Swap every `nn.Linear` of `model` (in place; names in `skip` stay) for an `Fp8Linear` sharing its
    parameters, as torchao's `convert_to_float8_training` does. Returns the model."""
    if not isinstance(recipe, Fp8Recipe):
        raise ValueError(f"recipe={recipe!r} must be an Fp8Recipe, e.g. Fp8Recipe('rowwise')")
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and full not in skip:
                setattr(mod, child_name, Fp8Linear.from_linear(child, recipe, full))
    return model


def fp8_stats(model: nn.Module) -> dict[str, dict[str, int]]:
    """Overflow, underflow, non-finite input and cast counts per operand role, summed over every Fp8Linear
    of `model`."""
    total = {role: {"overflow": 0, "underflow": 0, "nonfinite": 0, "numel": 0} for role in ROLES}
    for m in model.modules():
        if isinstance(m, Fp8Linear):
            for role in ROLES:
                for k, v in m.stats[role].items():
                    total[role][k] += v
    return total
