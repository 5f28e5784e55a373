"""The optimizer's step, tensor by tensor: what Adam allocates beside the model states, in each of PyTorch's
three implementations, and the fp32 master gradients of mixed precision (Micikevicius et al. 2018).

PyTorch's Adam (torch 2.13, `torch/optim/adam.py`) runs in one of three forms:

- **for-loop** (`foreach=False`, `_single_tensor_adam`): one parameter at a time, sqrt(v) and the
  denominator sqrt(v)/c + eps for that parameter; the previous parameter's denominator is freed only once
  the next one exists, so the scratch peaks at 4 (s_{i-1} + 2 s_i) bytes over consecutive tensors of s_i
  elements (fp32 state);
- **foreach** (`_multi_tensor_adam`): every update is one multi-tensor op over the whole list. The moments
  are updated in place (`_foreach_lerp_`, `_foreach_mul_`, `_foreach_addcmul_`); `_foreach_sqrt` then
  makes sqrt(v) of *every* parameter at once, one list that lives until `_foreach_addcdiv_`, so the
  scratch is one fp32 copy of the whole state, 4 Psi bytes (with `weight_decay` and not decoupled,
  `_foreach_add` makes a second one, a copy of the gradients; Adam's default `weight_decay=0` does not);
- **fused** (`fused=True`, `_fused_adam_`): one kernel updates each parameter in place; no scratch.

Which one a bare `torch.optim.Adam(params)` runs is `_default_to_fused_or_foreach` in
`torch/optim/optimizer.py`: fused only when asked for; foreach when every parameter is on a device with
foreach kernels (`_get_foreach_kernels_supported_devices`: cuda, xpu, mtia and the privateuse1 backend,
not cpu); else the for-loop. So the default is foreach on a GPU and the for-loop on the CPU (`DEFAULTS`).

Mixed precision (`precision.MasterWeights`) first makes fp32 copies of all 16-bit gradients (4 Psi bytes)
and checks each for inf/NaN with `torch.isfinite`, which ATen composes as `(g == g) * (g.abs() != inf)`:
for one tensor of s elements an fp32 `abs` and three one-byte masks, 7 s bytes, alive together.
"""

from __future__ import annotations

from collections.abc import Sequence

from distlab.memory.estimate.timeline import Timeline

FORMS = ("for-loop", "foreach", "fused")
DEFAULTS = {"cuda": "foreach", "cpu": "for-loop"}  # torch 2.13's choice for a bare Adam, by device
DEVICES = tuple(DEFAULTS)


def adam_form(adam: str, device: str) -> str:
    """The Adam implementation that runs: `adam` itself, or for "default" torch's choice on `device`."""
    if device not in DEFAULTS:
        raise ValueError(f"device={device!r} is unknown; choose one of {', '.join(DEVICES)}")
    if adam == "default":
        return DEFAULTS[device]
    if adam not in FORMS:
        raise ValueError(f"adam={adam!r} is unknown; choose 'default' (torch's choice per device: foreach on "
                         f"cuda, for-loop on cpu) or one of {', '.join(FORMS)}")
    return adam


def adam_kwargs(form: str) -> dict[str, bool]:
    """The keyword arguments that make `torch.optim.Adam` run `form`."""
    return {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[form]


def adam_scratch(sizes: Sequence[float], form: str, state_bytes: int = 4) -> float:
    """The most bytes Adam's step holds beside the model states (module docstring), for parameter tensors
    of `sizes` elements in the order the optimizer visits them."""
    if form == "fused" or not sizes:
        return 0.0
    if form == "foreach":
        return state_bytes * float(sum(sizes))
    prev = [0.0, *sizes[:-1]]
    return state_bytes * max(p + 2 * s for p, s in zip(prev, sizes, strict=True))


def adam_step(tl: Timeline, sizes: Sequence[float], form: str = "for-loop", state_bytes: int = 4) -> None:
    """Adam's step on the timeline: its scratch at its largest, then freed."""
    tl.where = f"Adam step ({form})"
    tl.alloc("adam.scratch", adam_scratch(sizes, form, state_bytes))
    tl.free("adam.scratch")


def master_step(tl: Timeline, sizes: Sequence[float], form: str = "for-loop") -> None:
    """`precision.MasterWeights.step`: fp32 copies of the 16-bit gradients for the masters, the inf/NaN
    check (7 bytes per element of one tensor at a time), Adam on the masters, the copy back in place."""
    tl.where = "fp32 master gradients"
    tl.alloc("master.grads", 4 * sum(sizes))
    tl.where = "unscale (isfinite)"
    tl.alloc("unscale.inv64", 8)  # 1/S in float64, then as float32
    tl.alloc("unscale.inv", 4)
    tl.free("unscale.inv64")
    tl.alloc("isfinite", 7 * max(sizes, default=0))
    tl.free("isfinite")
    tl.free("unscale.inv")
    adam_step(tl, sizes, form, 4)
