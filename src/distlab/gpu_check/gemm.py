"""What the FP8 cost model and the step-time model need from this GPU, measured: a grid of GEMMs in bf16
and in FP8, compiled casts, and FP8 against bf16 at five sizes, each beside its prediction.

- `gemm_grid`: bf16 products (`torch.matmul`) of square sizes and of the shapes a GPT block runs, and FP8
  products (`torch._scaled_mm`, E4M3 with tensorwise scales; Micikevicius et al. 2022) where the GPU has
  FP8 Tensor Cores (compute capability 8.9 or later); each a median of CUDA-event timings.
- `cast_grid`: the bf16 -> E4M3 cast with current scaling (amax, scale, saturate, convert), compiled with
  `torch.compile`, over sizes.
- `host_sync`: the host round trip that `MasterWeights` pays once per parameter tensor.
- `fp8_speedups`: t_bf16 / t_fp8 of a d x d x d product at d = 1,024 to 16,384, the FP8 one with the casts
  of both operands, as chapter 7's model prices it.

The pure parts run on any machine: `fit` turns the grid into `distlab.kernel_rates.KernelRates`
(`kernel_rates.from_report`), `compare_fp8` sets each measured speed-up beside the model's (the fallback's
and the one fitted here) and the break-even beside the measured one, within chapter 7's goal of 1.5x;
`render_lines` writes them for the text report. Without CUDA `measure` says so and times nothing.
"""

from __future__ import annotations

import statistics
from functools import partial

import torch

from distlab import kernel_rates
from distlab.timing import median_seconds

SQUARE = (512, 1024, 2048, 4096, 8192, 16384)
# (m, n, k) of a GPT block's products at 8192 tokens (b s), hidden 768 to 4096: Q/K/V, the MLP's up and down
BLOCK_SHAPES = tuple((8192, n, k) for h in (768, 1024, 2048, 4096)
                     for n, k in ((3 * h, h), (4 * h, h), (h, 4 * h)))
CAST_SIZES = tuple(d * d for d in (1024, 2048, 4096, 8192, 16384))
SPEEDUP_SIZES = (1024, 2048, 4096, 8192, 16384)
BREAK_EVEN_GOAL = 1.5  # predicted within 1.5x of the measured break-even (issue 35)


def cuda_seconds(fn, repeats: int = 20, warmup: int = 3) -> float:
    """The median over `repeats` calls of `fn()` timed with CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def has_fp8(device: torch.device) -> bool:
    """FP8 Tensor Cores (Ada and Hopper, compute capability 8.9 and later) and `torch._scaled_mm`."""
    return hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(device) >= (8, 9)


def cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 with a tensorwise current scale: x * (448 / amax), saturated, converted; and the inverse scale."""
    amax = x.abs().amax().float().clamp(min=1e-12)
    scale = 448.0 / amax
    return (x.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale.reciprocal()


def _fp8_product(a: torch.Tensor, b_t: torch.Tensor, cast) -> torch.Tensor:
    """a @ b in FP8: both operands cast, then `_scaled_mm` (the second operand column-major)."""
    qa, sa = cast(a)
    qb, sb = cast(b_t)
    return torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def gemm_grid(device: torch.device) -> dict:
    """bf16 and (where supported) FP8 products of `SQUARE` and `BLOCK_SHAPES`, seconds each."""
    shapes = [(d, d, d) for d in SQUARE] + list(BLOCK_SHAPES)
    out: dict = {"bf16": [], "fp8": []}
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        out["bf16"].append({"m": m, "n": n, "k": k, "seconds": cuda_seconds(partial(torch.matmul, a, b))})
        if has_fp8(device):
            qa, sa = cast_to_fp8(a)
            qb, sb = cast_to_fp8(b.t().contiguous())
            mm = partial(torch._scaled_mm, qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
            out["fp8"].append({"m": m, "n": n, "k": k, "seconds": cuda_seconds(mm)})
        del a, b
    return out


def cast_grid(device: torch.device, cast) -> list[dict]:
    """The compiled cast of `CAST_SIZES` values, seconds each."""
    rows = []
    for n in CAST_SIZES:
        x = torch.randn(n, device=device, dtype=torch.bfloat16)
        rows.append({"values": n, "seconds": cuda_seconds(partial(cast, x))})
    return rows


def fp8_speedups(device: torch.device, cast) -> list[dict]:
    """Measured t_bf16 / t_fp8 (both casts included) of d x d x d products, d in `SPEEDUP_SIZES`."""
    rows = []
    for d in SPEEDUP_SIZES:
        a = torch.randn(d, d, device=device, dtype=torch.bfloat16)
        b_t = torch.randn(d, d, device=device, dtype=torch.bfloat16)
        bf16 = cuda_seconds(partial(torch.matmul, a, b_t.t()))
        fp8 = cuda_seconds(partial(_fp8_product, a, b_t, cast))
        rows.append({"d": d, "bf16_seconds": bf16, "fp8_seconds": fp8, "speedup": bf16 / fp8})
    return rows


def host_sync(device: torch.device, values: int = 3072, repeats: int = 200) -> float:
    """Seconds per parameter of `memory.precision.unscale_`'s check on a small gradient: isfinite, all,
    the flag copied to the host (which waits for the GPU), the multiply; the median over `repeats`."""
    g = torch.randn(values, device=device)

    def check() -> None:
        _ = bool(torch.isfinite(g).all())
        g.mul_(1.0)

    return median_seconds(check, repeats, warmup=0)


def fit(section: dict, gpu: str) -> kernel_rates.KernelRates:
    """The rates this report's grid measured (`kernel_rates.from_report`)."""
    return kernel_rates.from_report(section, gpu)


def grid_comparison(rows: list[dict], curve: kernel_rates.GemmCurve) -> dict:
    """Each timed product's efficiency beside `curve`'s (the step-time model's fallback), and the range of
    predicted / measured times."""
    table = [{"m": r["m"], "n": r["n"], "k": r["k"],
              "measured_efficiency": 2.0 * r["m"] * r["n"] * r["k"] / (curve.peak * r["seconds"]),
              "predicted_efficiency": curve.efficiency(2.0 * r["m"] * r["n"] * r["k"]),
              "ratio": curve.seconds(r["m"], r["n"], r["k"]) / r["seconds"]} for r in rows]
    ratios = [t["ratio"] for t in table]
    return {"rows": table, "min_ratio": min(ratios), "max_ratio": max(ratios), "source": curve.source}


def measured_break_even(rows: list[dict]) -> float | None:
    """The smallest measured d at which FP8 pays (speed-up >= 1), interpolated in log d between the two
    sizes around it; None if it never pays."""
    for lo, hi in zip(rows, rows[1:], strict=False):
        if lo["speedup"] < 1 <= hi["speedup"]:
            w = (1 - lo["speedup"]) / (hi["speedup"] - lo["speedup"])
            return lo["d"] * (hi["d"] / lo["d"]) ** w
    return rows[0]["d"] if rows and rows[0]["speedup"] >= 1 else None


def compare_fp8(rows: list[dict], gpu: str, fitted: kernel_rates.KernelRates | None = None) -> dict:
    """Each measured speed-up beside chapter 7's roofline, its fallback model and (given) the model with
    the rates measured here; the break-evens and whether the model is within `BREAK_EVEN_GOAL` of the
    measured one."""
    from distlab.memory.fp8 import cost_model

    models = {"roofline": dict(model="roofline"), "fallback": dict(model="measured")}
    if fitted is not None:
        models["fitted"] = dict(model="measured", rates=fitted)
    table = [{"d": r["d"], "measured": r["speedup"],
              **{name: cost_model.speedup(r["d"], r["d"], r["d"], gpu, **kw) for name, kw in models.items()}}
             for r in rows]
    measured = measured_break_even(rows)
    predicted = {name: cost_model.break_even(gpu, **kw) for name, kw in models.items()}
    best = predicted.get("fitted", predicted["fallback"])
    within = measured is not None and 1 / BREAK_EVEN_GOAL <= best / measured <= BREAK_EVEN_GOAL
    return {"rows": table, "measured_break_even": measured, "predicted_break_even": predicted,
            "goal": BREAK_EVEN_GOAL, "within_goal": within}


def render_lines(section: dict | None) -> list[str]:
    """The text report's lines: the fitted curves, then each size's speed-up, then the break-evens."""
    if not section:
        return []
    comparison = section.get("comparison")
    return (_curve_lines(section) + _timing_lines(section)
            + (_comparison_lines(comparison) if comparison else []))


def _curve_lines(section: dict) -> list[str]:
    """The fitted bf16 and fp8 GEMM efficiency curves, one line each."""
    lines = []
    for name in ("bf16", "fp8"):
        c = section.get("fitted", {}).get(name)
        if c:
            lines.append(f"gemm {name}: e_max {c['e_max']:.2f} of peak, half of it at "
                         f"{c['f_half'] / 1e9:.1f} GFLOP ({len(section.get(name, []))} shapes timed)")
    return lines


def _timing_lines(section: dict) -> list[str]:
    """The bf16 grid against the fallback curve, the host synchronisation, and the FP8 cast."""
    lines = []
    grid = section.get("grid")
    if grid:
        lines.append(f"gemm bf16 grid against the step model's fallback curve: predicted / measured time "
                     f"{grid['min_ratio']:.2f} to {grid['max_ratio']:.2f} over {len(grid['rows'])} shapes")
    if section.get("host_sync_seconds"):
        lines.append(f"host synchronisation (MasterWeights' check, per parameter tensor): "
                     f"{section['host_sync_seconds'] * 1e6:.1f} us")
    if section.get("cast_note"):
        lines.append(f"cast: {section['cast_note']}")
    cast = section.get("fitted", {}).get("cast")
    if cast:
        lines.append(f"cast bf16->e4m3 (compiled): {100 * cast['hbm_fraction']:.0f} % of the HBM roofline "
                     f"+ {cast['fixed_s'] * 1e6:.1f} us")
    return lines


def _comparison_lines(comparison: dict) -> list[str]:
    """Each size's FP8-over-bf16 speed-up (measured and modelled), then the break-evens against the goal."""
    lines = []
    for r in comparison["rows"]:
        extra = f", fitted {r['fitted']:.2f}x" if "fitted" in r else ""
        lines.append(f"fp8/bf16 d={r['d']}: measured {r['measured']:.2f}x, roofline "
                     f"{r['roofline']:.2f}x, fallback {r['fallback']:.2f}x{extra}")
    pred = ", ".join(f"{k} {v:,.0f}" for k, v in comparison["predicted_break_even"].items())
    got = comparison["measured_break_even"]
    shown = "never" if got is None else f"{got:,.0f}"
    lines.append(f"fp8 break-even: measured {shown}; predicted {pred} "
                 f"({'within' if comparison['within_goal'] else 'OUTSIDE'} {comparison['goal']}x)")
    return lines


def measure(device: int = 0) -> dict:
    """Everything above on CUDA GPU `device`, as the report's "gemm" section."""
    from dataclasses import asdict

    from distlab.gpu_check.block import catalog_gpu

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA GPU: nothing timed"}
    dev = torch.device("cuda", device)
    name = torch.cuda.get_device_name(dev)
    gpu = "H200" if "H200" in name.upper() else catalog_gpu(name)
    section = {"device": name, **gemm_grid(dev), "host_sync_seconds": host_sync(dev)}
    if has_fp8(dev):
        cast = torch.compile(cast_to_fp8)
        try:
            cast(torch.ones(16, device=dev, dtype=torch.bfloat16))
        except Exception as e:  # no compiler on this node: time the eager cast, and say so
            cast, section["cast_note"] = cast_to_fp8, f"torch.compile failed ({type(e).__name__}): eager cast"
        section["cast"] = cast_grid(dev, cast)
        section["speedup"] = fp8_speedups(dev, cast)
    if gpu in kernel_rates.SPECS:
        from distlab.plan.kernel_time import fallback_rates

        section["grid"] = grid_comparison(section["bf16"], fallback_rates(gpu).bf16)
        rates = fit(section, gpu)
        section["fitted"] = {"bf16": asdict(rates.bf16), "fp8": asdict(rates.fp8), "cast": asdict(rates.cast)}
        if section.get("speedup"):
            section["comparison"] = compare_fp8(section["speedup"], gpu, rates)
    return section
