"""Mixed-precision training from scratch: 16-bit compute, fp32 master weights, and loss scaling.

Micikevicius et al. 2018 ("Mixed Precision Training", ICLR) keep three things:

1. **an fp32 master copy of the weights** ("weight backup"): the model computes in fp16 or bf16, but the
   update w <- w - lr * g is applied to fp32 copies and cast back, because an update smaller than half a
   unit in the last place of a 16-bit weight would be rounded away (`MasterWeights`);
2. **loss scaling**: fp16 has 5 exponent bits, so gradients below 2^-24 (about 6e-8) flush to zero.
   Multiplying the loss by S shifts every gradient up by S; the gradients are divided by S again in fp32
   before the update (`unscale_`);
3. **fp32 accumulation** of long sums (`accumulation_demo` shows why).

A fixed S is *static* loss scaling. *Dynamic* loss scaling (`LossScaler`) starts high, halves S and skips
the step whenever a gradient is inf or NaN, and doubles S after `growth_interval` clean steps in a row:
the rule of `torch.amp.GradScaler`, against which `compare_with_grad_scaler` checks ours step by step.
bf16 has fp32's 8 exponent bits, so it needs no loss scaling (Kalamkar et al. 2019).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

HALF = (torch.float16, torch.bfloat16)


def update_scale(
    scale: float,
    growth_tracker: int,
    found_inf: bool,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> tuple[float, int]:
    """The dynamic loss-scale rule (Micikevicius et al. 2018, sec. 3.2; `torch.amp.GradScaler.update`):
    after an overflow, scale * backoff_factor and the count of clean steps starts again from 0; after a
    clean step the count grows, and when it reaches growth_interval the scale grows by growth_factor and
    the count restarts. Returns (new scale, new count)."""
    if found_inf:
        return scale * backoff_factor, 0
    growth_tracker += 1
    if growth_tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker


@dataclass
class LossScaler:
    """A loss scale and its update rule: dynamic (GradScaler's) or static (`dynamic=False`, S fixed;
    steps with inf or NaN gradients are still skipped)."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    dynamic: bool = True
    scale: float = field(init=False)
    growth_tracker: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not self.init_scale > 0:
            raise ValueError(f"init_scale={self.init_scale} must be positive; 2**16 is the usual start")
        if self.growth_factor <= 1 or not 0 < self.backoff_factor < 1:
            raise ValueError(
                f"growth_factor={self.growth_factor} must be > 1 and backoff_factor="
                f"{self.backoff_factor} in (0, 1); GradScaler uses 2.0 and 0.5"
            )
        if self.growth_interval < 1:
            raise ValueError(f"growth_interval={self.growth_interval} must be at least 1 step")
        self.scale = float(self.init_scale)

    def update(self, found_inf: bool) -> None:
        if self.dynamic:
            self.scale, self.growth_tracker = update_scale(
                self.scale,
                self.growth_tracker,
                found_inf,
                self.growth_factor,
                self.backoff_factor,
                self.growth_interval,
            )


def unscale_(grads: Iterable[Tensor], scale: float) -> bool:
    """Divide every gradient by `scale` in place (a multiplication by the fp32 reciprocal, as GradScaler
    does) and return True if any of them held an inf or a NaN."""
    inv = torch.tensor(1.0 / scale, dtype=torch.float64).float()
    found = False
    for g in grads:
        found = found or not bool(torch.isfinite(g).all())
        g.mul_(inv.to(g.dtype))
    return found


def scaled_step(model: nn.Module, loss: Tensor, optimizer: torch.optim.Optimizer, scaler: LossScaler) -> bool:
    """backward(loss * S), unscale, then step unless a gradient overflowed; update S. Returns skipped."""
    (loss * scaler.scale).backward()
    found_inf = unscale_([p.grad for p in model.parameters() if p.grad is not None], scaler.scale)
    if not found_inf:
        optimizer.step()
    scaler.update(found_inf)
    return found_inf


class MasterWeights:
    """fp32 master weights for a model whose parameters are fp16 or bf16 (Micikevicius et al. 2018).

    `step()` unscales the 16-bit gradients into fp32 master gradients, skips on inf/NaN, runs the fp32
    optimizer (built by `make_optimizer` over the masters) and copies the masters back into the model.
    """

    def __init__(self, model: nn.Module, make_optimizer, scaler: LossScaler | None = None) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        dtypes = sorted({str(p.dtype) for p in self.params})
        if any(p.dtype not in HALF for p in self.params):
            raise ValueError(
                f"MasterWeights needs a model in float16 or bfloat16, its parameters are {dtypes}; "
                "call model.half() or model.to(torch.bfloat16) first"
            )
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = make_optimizer(self.master)
        self.scaler = scaler or LossScaler(dynamic=False, init_scale=1.0)

    def backward(self, loss: Tensor) -> None:
        (loss.float() * self.scaler.scale).backward()

    def step(self) -> bool:
        """Apply the update if the gradients are finite; returns True when the step was skipped."""
        for p, m in zip(self.params, self.master, strict=True):
            m.grad = None if p.grad is None else p.grad.float()
        found_inf = unscale_([m.grad for m in self.master if m.grad is not None], self.scaler.scale)
        if not found_inf:
            self.optimizer.step()
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=True):
                    p.copy_(m)
        self.scaler.update(found_inf)
        return found_inf

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_tensors(self) -> list[Tensor]:
        """The fp32 masters and the optimizer's state: the K = 12 bytes per parameter of ZeRO's count."""
        state = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
        return self.master + state


# ----------------------------------------------------------------------------- checked against GradScaler


@dataclass
class ScalerTrace:
    """Per step: the scale used, and whether the step was skipped; and the final parameters."""

    scales: list[float]
    skipped: list[bool]
    params: list[Tensor]


def _gpt_and_data(seed: int):
    from distlab.models import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=12, block_size=16, n_layer=1, n_head=2, n_embd=32))
    g = torch.Generator().manual_seed(seed + 1)
    batches = [torch.randint(12, (4, 16), generator=g) for _ in range(2)]
    return model, batches


def trace_scaler(
    use_torch: bool,
    steps: int,
    init_scale: float,
    growth_interval: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float16,
) -> ScalerTrace:
    """Train the small GPT for `steps` steps under CPU autocast in `dtype`, scaling the loss either with
    `torch.amp.GradScaler` (use_torch) or with `LossScaler` + `unscale_`; the same seed and batches."""
    model, batches = _gpt_and_data(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    ours = LossScaler(init_scale=init_scale, growth_interval=growth_interval)
    scales, skipped = [], []
    for t in range(steps):
        x = batches[t % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            loss = model(x, x.roll(-1, dims=1))[1]
        if use_torch:
            scales.append(ref.get_scale())
            ref.scale(loss).backward()
            ref.step(opt)
            ref.update()
            skipped.append(ref.get_scale() < scales[-1])
        else:
            scales.append(ours.scale)
            skipped.append(scaled_step(model, loss, opt, ours))
    return ScalerTrace(scales, skipped, [p.detach().clone() for p in model.parameters()])


def compare_with_grad_scaler(
    steps: int = 12, init_scale: float = 2.0**24, growth_interval: int = 3, seed: int = 0
) -> dict[str, object]:
    """Our scaler against GradScaler on the same run: same scales, same skipped steps, same weights."""
    a = trace_scaler(True, steps, init_scale, growth_interval, seed)
    b = trace_scaler(False, steps, init_scale, growth_interval, seed)
    same_params = all(torch.equal(x, y) for x, y in zip(a.params, b.params, strict=True))
    return {
        "scales": b.scales,
        "skipped": b.skipped,
        "same_scales": a.scales == b.scales,
        "same_skipped": a.skipped == b.skipped,
        "same_params": same_params,
    }


# ------------------------------------------------------------------------------------- why it is needed


def underflow_fraction(values: Tensor, scale: float = 1.0, dtype: torch.dtype = torch.float16) -> float:
    """The fraction of the nonzero `values` that become 0 when multiplied by `scale` and cast to `dtype`."""
    nz = values[values != 0].float()
    return float(((nz * scale).to(dtype) == 0).float().mean()) if nz.numel() else 0.0


def accumulation_demo(n: int = 4096, value: float = 1.0) -> dict[str, float]:
    """Add `value` to itself n times with an fp16 accumulator and with an fp32 one (numpy scalars, so every
    step rounds). In fp16 the sum stalls once `value` is below half the spacing of representable numbers
    around the running sum: 1 + 2048 rounds back to 2048."""
    acc16, acc32 = np.float16(0), np.float32(0)
    v16, v32 = np.float16(value), np.float32(value)
    for _ in range(n):
        acc16 = np.float16(acc16 + v16)
        acc32 = np.float32(acc32 + v32)
    return {"fp16": float(acc16), "fp32": float(acc32), "exact": n * float(v16)}


def gradient_magnitudes(model: nn.Module) -> Tensor:
    """All parameter gradients of `model`, flattened into one fp32 tensor (for a histogram)."""
    return torch.cat([p.grad.detach().float().reshape(-1) for p in model.parameters() if p.grad is not None])


# ------------------------------------------------------------------------------- can this device do it?


def cuda_supports(dtype: torch.dtype, capability: Sequence[int]) -> bool:
    """Whether an NVIDIA GPU of compute `capability` computes in `dtype`: fp16 arithmetic from 5.3 on
    (Pascal's sm_53/60), bf16 from 8.0 on (Ampere)."""
    need = {torch.float16: (5, 3), torch.bfloat16: (8, 0)}.get(dtype, (0, 0))
    return tuple(capability) >= need


def _probe(dtype: torch.dtype, device: torch.device) -> None:
    """One tiny forward and backward of every op the GPT needs (matmul, LayerNorm, attention) in `dtype`."""
    x = torch.randn(2, 4, 8, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(8, 8, device=device, dtype=dtype)
    y = torch.nn.functional.layer_norm(x @ w, (8,))
    q = y.view(2, 4, 2, 4).transpose(1, 2)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()


def require_dtype(dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
    """Raise a ValueError naming the device and the fix if `device` cannot train in `dtype`.

    "Cannot" means: on CUDA, a compute capability below what `cuda_supports` asks; anywhere, one of the
    ops of a GPT step raising in that dtype. PyTorch 2.13 runs all of them in fp16 and bf16 on CPU (in
    software, through fp32, unless the CPU has AVX512-FP16 or AMX), so CPU passes, slowly.
    """
    device = torch.device(device)
    name = str(dtype).replace("torch.", "")
    fix = (
        "use dtype=torch.bfloat16 (no loss scaling needed)"
        if dtype == torch.float16
        else "use dtype=torch.float16 with loss scaling"
    ) + ", or torch.float32"
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if not cuda_supports(dtype, cap):
            raise ValueError(
                f"{torch.cuda.get_device_name(device)} ({device}, compute capability "
                f"{cap[0]}.{cap[1]}) cannot compute in {name}; {fix}"
            )
    try:
        _probe(dtype, device)
    except (RuntimeError, NotImplementedError) as e:
        raise ValueError(
            f"device {device} cannot train in {name} ({str(e).splitlines()[0]}); {fix}"
        ) from None
