"""FP8 from scratch (distlab.memory.fp8), without ranks: the formats against torch, the casts, the emulated
FP8 linear layer against torchao's `Float8Linear(emulate=True)`, the granularity comparison on the GPT,
the cost model, and the FP8 option of chapter 7's estimator and chapter 9's planner.

Tolerance against torchao: none beyond float32 rounding. Both sides cast the same values with the same
scale (max_fp8 / amax in float64, rounded to float32), read them back by the same division and multiply
in float32, so outputs and gradients agree to 1e-6 relative (measured: bitwise equal); a different scale
or format moves them by the FP8 step, 2^-3 = 12.5 % of a value.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
from torch import nn

from distlab import reference
from distlab.memory.__main__ import main
from distlab.memory.estimate.estimator import MemoryConfig, estimate
from distlab.memory.fp8 import compare, cost_model
from distlab.memory.fp8.formats import E4M3, E5M2, FORMATS, check_against_torch, fp8_format
from distlab.memory.fp8.linear import Fp8Linear, Fp8Recipe, convert_to_fp8
from distlab.memory.fp8.scaling import DelayedScaling, block_amax, operand_block, quantize
from distlab.memory.measure import accounting
from distlab.plan import Candidate, ClusterSpec, Settings, Workload, memory, preset, step_time


def test_formats_from_their_bits_match_torch() -> None:
    for fmt in FORMATS.values():
        assert all(check_against_torch(fmt).values()), check_against_torch(fmt)
    assert (E4M3.max, E4M3.min_normal, E4M3.min_subnormal, E4M3.eps) == (448, 2**-6, 2**-9, 2**-3)
    assert (E5M2.max, E5M2.min_normal, E5M2.min_subnormal, E5M2.eps) == (57344, 2**-14, 2**-16, 2**-2)
    assert E5M2.binades > E4M3.binades + 13  # the gradients' range
    assert E4M3.step_at(300.0) == 32 and E4M3.step_at(1e-3) == 2**-9 and E5M2.step_at(1.0) == 0.25
    with pytest.raises(ValueError, match="format='fp16' is not an FP8 format; choose 'e4m3'"):
        fp8_format("fp16")
    with pytest.raises(ValueError, match=r"x=500.0 is outside \(0, 448.0\]"):
        E4M3.step_at(500.0)


def test_quantize_blocks_counts_and_delayed_scaling() -> None:
    x = torch.linspace(-1, 1, 5 * 300).view(5, 300)
    x[2, 0] = 1e4  # one outlier, in the row that holds the values near 0
    assert operand_block("rowwise", 1) == (1, None) and operand_block("rowwise", 0) == (None, 1)
    assert operand_block("blockwise", 1) == (1, 128)
    assert operand_block("blockwise", 0, weight=True) == (128, 128)
    assert block_amax(x, (1, 128)).shape == (5, 3) and float(block_amax(x, (1, 128))[2, 0]) == 1e4
    errs = {}
    for g in ("tensorwise", "rowwise", "blockwise"):
        q = quantize(x, "e4m3", operand_block(g, 1))
        assert q.overflow == 0  # current scaling never saturates
        errs[g] = (q.underflow,)
    # the outlier's scale crushes its neighbours; finer groups keep them
    assert errs["tensorwise"][0] >= errs["rowwise"][0] > errs["blockwise"][0] == 0
    stale = quantize(x, E4M3, scale=torch.tensor([[1.0]]))  # a scale from before the outlier grew
    assert stale.overflow == 1 and float(stale.dequantize()[2, 0]) == 448
    d = DelayedScaling(history=2)
    d.scale("w", torch.ones(2, 2), E4M3)
    s = d.scale("w", 10 * torch.ones(2, 2), E4M3)  # scaled by the history's amax 1, not by 10
    assert float(s) == 448 and quantize(10 * torch.ones(2, 2), E4M3, scale=s).overflow == 4
    with pytest.raises(ValueError, match="granularity='colwise' is unknown"):
        operand_block("colwise", 1)
    with pytest.raises(ValueError, match="delayed scaling keeps one amax history per tensor"):
        Fp8Recipe("rowwise", delayed=DelayedScaling())
    with pytest.raises(ValueError, match="history=0 must be a positive number"):
        DelayedScaling(history=0)


def _run(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    x = x.clone().requires_grad_()
    y = model(x)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return y.detach(), x.grad, [p.grad for p in model.parameters()]


@functools.cache
def _torchao():
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    return Float8LinearConfig, convert_to_float8_training


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_linear_matches_torchao_float8_linear(recipe: str) -> None:
    config_cls, convert = _torchao()
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(48, 80), nn.GELU(), nn.Linear(80, 24))  # sizes no tile divides
    x = torch.randn(3, 7, 48)
    config = dataclasses.replace(config_cls.from_recipe_name(recipe), emulate=True)
    theirs = _run(convert(copy.deepcopy(mlp), config=config), x)
    ours = _run(convert_to_fp8(copy.deepcopy(mlp), Fp8Recipe.torchao(recipe)), x)
    for a, b in zip([theirs[0], theirs[1], *theirs[2]], [ours[0], ours[1], *ours[2]], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(ours[0], mlp(x), rtol=1e-4)  # it is FP8: the float32 layer differs


def test_fp8_gpt_step_matches_torchao_and_save_fp8_halves_saved_inputs() -> None:
    config_cls, convert = _torchao()
    task = reference.gpt_task()
    x, y = task.batch(0, 4, 0)
    grads = []
    for m in (convert(task.build(0), config=config_cls(emulate=True)),
              convert_to_fp8(task.build(0), Fp8Recipe()),
              convert_to_fp8(task.build(0), Fp8Recipe(save_fp8=True))):
        m(x, y)[1].backward()
        grads.append([p.grad for p in m.parameters()])
    for theirs, ours, saved in zip(*grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
        assert torch.equal(ours, saved)  # tensorwise: the forward's FP8 copy of x is what dW needs
    lin = Fp8Linear(64, 32, recipe=Fp8Recipe(save_fp8=True))
    inp = torch.randn(8, 64)
    saved = accounting.saved_activation_bytes(lambda: lin(inp), lin.parameters())
    assert saved == 8 * 64 + 4  # one byte a value and the float32 scale, not 4 bytes a value
    with pytest.raises(ValueError, match="recipe='bf16' is not one of torchao's emulated recipes"):
        Fp8Recipe.torchao("bf16")


def test_granularities_on_the_gpt_against_bf16() -> None:
    threads = torch.get_num_threads()
    rows = compare.compare_granularities(steps=2, batch=2, n_embd=128)
    assert torch.get_num_threads() == threads
    bf16, fp8 = rows[0], {r.name: r for r in rows[1:]}
    assert bf16.name == "bf16" and set(fp8) == set(compare.RECIPES)
    for r in fp8.values():  # E4M3 and E5M2 keep 4 and 5 fewer mantissa bits than bf16's 7
        assert 4 < r.vs(bf16) < 64, (r.name, r.vs(bf16))
        assert r.casts > 0 and r.underflow > 0
    assert all(fp8[n].overflow == 0 for n in fp8 if "delayed" not in n)  # current scaling never saturates
    assert fp8["blockwise 1x128 / 128x128"].underflow < fp8["tensorwise, current"].underflow
    assert compare.ranking(rows)[-1].startswith("tensorwise")


def test_cost_model_fp8_pays_only_for_large_matmuls() -> None:
    assert cost_model.speedup(256, 256, 256) < 1 < cost_model.speedup(16384, 16384, 16384) < 2
    assert cost_model.speedup(8192, 8192, 8192, scaling="delayed") > cost_model.speedup(8192, 8192, 8192)
    d = cost_model.break_even()
    assert cost_model.speedup(d * 0.9, d * 0.9, d * 0.9) < 1 < cost_model.speedup(d * 1.1, d * 1.1, d * 1.1)
    t = cost_model.linear_times(64, 64, 64)
    assert t["fp8"] == t["fp8 gemm"] + t["cast"]
    with pytest.raises(ValueError, match="gpu='A100' has no FP8 peak"):
        cost_model.speedup(1, 1, 1, gpu="A100")
    with pytest.raises(ValueError, match="m=0 must be at least 1"):
        cost_model.linear_times(0, 1, 1)


def test_estimator_and_planner_fp8_option() -> None:
    base = dict(layers=4, hidden=1024, heads=16, vocab=1000, seq=512, attention="flash", dropout=False)
    a, b = estimate(MemoryConfig(**base)), estimate(MemoryConfig(**base, fp8=True))
    assert a.model_states_bytes == b.model_states_bytes
    s, h = 512, 1024  # qkv, projection, MLP inputs (s h each), MLP output layer's (4 s h): 1 byte less
    assert a.activations_bytes - b.activations_bytes == 4 * 7 * s * h
    full = dict(base, recompute="full")
    assert estimate(MemoryConfig(**full, fp8=True)) == estimate(MemoryConfig(**full))
    cli = main(["estimate", "--layers", "4", "--hidden", "1024", "--heads", "16", "--vocab", "1000",
                "--seq", "512", "--attention", "flash", "--no-dropout", "--fp8", "--json"])
    assert cli["activations_bytes"] == b.activations_bytes
    with pytest.raises(ValueError, match="fp8=True needs precision='mixed'"):
        estimate(MemoryConfig(**base, precision="fp32", fp8=True))
    model, cluster, work = preset("tiny"), ClusterSpec("H100", nodes=2), Workload(64)
    c = Candidate(16, 1, 1, 1, 3, "none", 1)
    for overlap in (True, False):
        t16, t8 = (step_time(model, cluster, work, c, Settings(fp8=f, overlap_dp=overlap))
                   for f in (False, True))
        assert t8.dp < t16.dp and t8.compute == t16.compute
    m16, m8 = (memory(model, cluster, work, c, Settings(fp8=f)) for f in (False, True))
    assert m8.activations_bytes < m16.activations_bytes
    z1 = Candidate(16, 1, 1, 1, 1, "none", 1)  # ZeRO-1 gathers nothing: FP8 weights do not change its dp
    z1_dp = step_time(model, cluster, work, z1).dp
    assert step_time(model, cluster, work, z1, Settings(fp8=True)).dp == z1_dp
