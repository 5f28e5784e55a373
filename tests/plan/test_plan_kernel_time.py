"""distlab.plan.kernel_time: each part of a step priced where it runs, by hand on small shapes; the
fallback against the two blocks timed on an H100; the planner's `kernels="parts"`."""

from __future__ import annotations

import json

import pytest

from distlab.kernel_rates import CastCost, GemmCurve, KernelRates
from distlab.plan import kernel_time as kt
from distlab.plan.candidates import Candidate
from distlab.plan.cost_model import step_time
from distlab.plan.efficiency import MEASURED, SHAPE_STUDY
from distlab.plan.inputs import ClusterSpec, ModelSpec, Workload

SMALL = ModelSpec(layers=2, hidden=64, heads=4, vocab=100, seq=8)
P = 1e12


def rates(e_max: float = 0.5, f_half: float = 0.0, flash: float = 0.25, bandwidth: float = 1e9
          ) -> KernelRates:
    """Round numbers: a 1 TFLOP/s GPU whose memory-bound kernels reach `bandwidth` bytes/s."""
    curve = GemmCurve(e_max, f_half, P, "hand")
    fp8, cast = GemmCurve(e_max, f_half, 2 * P, "hand"), CastCost(1.0, 0.0, 1e9, "hand")
    return KernelRates("test", curve, fp8, cast, bandwidth, 1.0, flash, "hand")


def test_block_gemms_follow_megatrons_split() -> None:
    assert kt.block_gemms(SMALL, 16) == [(16, 192, 64), (16, 64, 64), (16, 256, 64), (16, 64, 256)]
    assert kt.block_gemms(SMALL, 16, tp=2) == [(16, 96, 64), (16, 64, 32), (16, 128, 64), (16, 64, 128)]
    gqa = ModelSpec(layers=1, hidden=64, heads=4, vocab=10, seq=8, kv_heads=1, ffn=96, gated=True)
    assert kt.block_gemms(gqa, 16) == [(16, 64 + 2 * 16, 64), (16, 64, 64), (16, 192, 64), (16, 64, 96)]


def test_gemm_and_head_terms_by_hand() -> None:
    p = kt.micro_batch_parts(SMALL, 2, rates(bandwidth=1e30, flash=1e9))
    tokens = 16  # b s
    block = 2 * tokens * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64)  # forward FLOPs of the four products
    assert p.gemm == pytest.approx(3 * 2 * block / (0.5 * P))  # 2 layers, forward + 2 backward, at e_max
    assert p.head == pytest.approx(3 * 2 * tokens * 100 * 64 / (0.5 * P))
    slow = kt.micro_batch_parts(SMALL, 2, rates(f_half=1e6, bandwidth=1e30))
    assert slow.gemm - p.gemm == pytest.approx(3 * 2 * 4 * 1e6 / (0.5 * P))  # t_0 = f_half/(e_max P) each


def test_attention_by_its_kernel() -> None:
    r = rates(flash=0.25, bandwidth=1e9)
    # flash: half of the 4 b s s h forward FLOPs executed (causal), backward twice forward, at 0.25 of P
    assert kt.attention_seconds(SMALL, 2, r) == pytest.approx(3 * 0.5 * 4 * 2 * 8 * 8 * 64 / (0.25 * P))
    # math: b a products of (s x d) by (d x s), twice (QK^T, PV), three times; scores 12 passes of 2 bytes
    gemm = 3 * 2 * 2 * 4 * (2 * 8 * 8 * 16) / (0.5 * P)
    assert kt.attention_seconds(SMALL, 2, r, attention="math") == pytest.approx(
        gemm + 12 * 2 * (2 * 4 * 8 * 8) / 1e9)
    with pytest.raises(ValueError, match="attention='sdpa' is unknown"):
        kt.attention_seconds(SMALL, 2, r, attention="sdpa")


def test_memory_bound_terms_by_hand() -> None:
    tokens = 16
    assert kt.block_memory_values(SMALL, tokens) == tokens * (10 * 64 + 12 * 64 + 5 * 256 + 4 * 64)  # 47,104
    embedding = tokens * 8 * 64 + 4 * 100 * 64  # gather and sum; the table's dense gradient
    loss = tokens * (5 * 64 + 6 * 100)  # final norm; log-softmax and its gradient over T x V
    assert kt.memory_values(SMALL, tokens) == 2 * 47104 + embedding + loss == 142720
    p = kt.micro_batch_parts(SMALL, 2, rates(bandwidth=1e9))
    assert p.memory == pytest.approx(2 * 142720 / 1e9)
    assert kt.optimizer_seconds(1e6, rates(bandwidth=1e9)) == pytest.approx(40e6 / 1e9)
    assert kt.optimizer_seconds(1e6, rates(bandwidth=1e9), "fp32") == pytest.approx(28e6 / 1e9)
    with pytest.raises(ValueError, match="precision='fp16' is unknown"):
        kt.optimizer_seconds(1.0, rates(), "fp16")


def test_one_gpu_step_and_effective_efficiency() -> None:
    r = rates(e_max=0.5, flash=0.25, bandwidth=1e30)  # causal flash at e_max / 2 = the counted FLOPs at e_max
    assert kt.effective_efficiency(SMALL, 2, r) == pytest.approx(0.5)
    assert kt.parameter_tensors(SMALL) == 2 * 12 + 2 + 2  # blocks; token and position tables; final norm
    step = kt.one_gpu_step(SMALL, 2, r)  # MasterWeights: one host synchronisation per parameter tensor
    assert step.optimizer == pytest.approx(40 * SMALL.params / 1e30 + 28 * r.sync_s)
    assert step.total == pytest.approx(kt.micro_batch_flops(SMALL, 2) / (0.5 * P) + step.optimizer)
    adam = 40 * SMALL.params / 1e30
    assert kt.one_gpu_step(SMALL, 2, r, per_tensor_sync=False).optimizer == pytest.approx(adam)
    assert kt.one_gpu_step(SMALL, 2, r, precision="fp32").optimizer == pytest.approx(adam * 28 / 40)
    with pytest.raises(ValueError, match="micro_batch=0"):
        kt.micro_batch_parts(SMALL, 0, r)


def test_fallback_fits_the_22b_block_and_predicts_the_llama_block() -> None:
    r = kt.fallback_rates("H100")
    block = next(b for b in MEASURED if b.gpu == "H100")
    assert kt.block_seconds(block, r) * 1e3 == pytest.approx(block.forward_ms + block.backward_ms, rel=1e-6)
    llama = SHAPE_STUDY[0]  # not fitted: within 5 % of what gpu-check measured
    assert kt.block_seconds(llama, r) * 1e3 == pytest.approx(llama.forward_ms + llama.backward_ms, rel=0.05)
    assert r.bf16.efficiency(2 * 8192 * 768 * 768) < 0.3 < 0.7 < r.bf16.efficiency(2 * 8192 * 16384**2)


def test_planner_parts_equal_the_one_gpu_step_and_reject_unknown_gpus() -> None:
    gpt2 = ModelSpec(12, 768, 12, 50257, 1024, name="gpt2-small")
    one = Candidate(1, 1, 1, 1, 0, "none", 8)
    parts = step_time(gpt2, ClusterSpec("H100", 1, 1), Workload(8, kernels="parts"), one)
    want = kt.one_gpu_step(gpt2, 8, kt.fallback_rates("H100"), per_tensor_sync=False).total
    assert parts.total == pytest.approx(want, rel=1e-9)
    block = step_time(gpt2, ClusterSpec("H100", 1, 1), Workload(8), one)
    assert block.total < 0.6 * parts.total  # the single eta of 0.52 is far too optimistic at h = 768
    fixed = step_time(gpt2, ClusterSpec("H100", 1, 1), Workload(8, 0.52, kernels="parts"), one)
    assert fixed.total == block.total  # an explicit efficiency overrides the parts
    with pytest.raises(ValueError, match="kernels='fast' is unknown"):
        Workload(8, kernels="fast")
    with pytest.raises(ValueError, match="gpu='A100' has no kernel rates"):
        step_time(gpt2, ClusterSpec("A100", 1, 1), Workload(8, kernels="parts"), one)


def test_cli_kernels_parts(capsys) -> None:
    from distlab.plan.__main__ import main

    argv = ["--preset", "tiny", "--gpu", "H100", "--nodes", "1", "--batch", "16", "--top", "1", "--json"]
    assert main(argv) == 0
    block = json.loads(capsys.readouterr().out)
    assert main([*argv, "--kernels", "parts"]) == 0
    parts = json.loads(capsys.readouterr().out)
    assert (block["kernels"], parts["kernels"]) == ("block", "parts")
    # the tiny model's small GEMMs run far below the 22B block's efficiency: the parts are slower
    assert parts["candidates"][0]["time"]["total"] > block["candidates"][0]["time"]["total"]
