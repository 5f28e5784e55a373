"""Chapter 12's dry run of a DeepSeek-V3-shaped rank: its modules on the meta device hold exactly the
parameters chapter 7's MoE estimator counts, and one MoE layer's dispatch and combine on the fake world of
2,048 ranks move exactly the bytes chapter 9's cost model prices."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from distlab.dryrun.moe_rank import FusedRMSNorm, moe_layer_step, split_counts, stage_modules
from distlab.memory.estimate.moe_activations import attention_bytes, layer_bytes, routed_bytes
from distlab.memory.estimate.moe_states import moe_states, stage_params
from distlab.plan import moe_published
from distlab.plan.moe_cost import MoEAssumptions
from distlab.plan.moe_traffic import a2a_bytes


@pytest.mark.parametrize("name", [r.name for r in moe_published.JUDGED])
def test_meta_modules_of_every_stage_hold_what_the_estimator_counts(name: str) -> None:
    config = next(r for r in moe_published.JUDGED if r.name == name).config()
    counted = stage_params(config.shape, config.layout)
    for stage in range(config.layout.size("pp")):
        assert split_counts(stage_modules(config.shape, config.layout, stage)) == counted[stage], stage


def test_deepseek_v3_rank_model_states_fit_and_its_all_to_all_is_the_cost_models() -> None:
    row = next(r for r in moe_published.JUDGED if r.name == "deepseek-v3")
    config = row.config()  # 2,048 H800: pp 16, ep 64, dp 128, edp 2
    dense, experts = split_counts(stage_modules(config.shape, config.layout, 15))
    states = moe_states(config.shape, config.layout, zero=1)  # BF16 weights and gradients, ZeRO-1 Adam
    assert states.stage == 15 and states.params_bytes == 2 * (dense + experts)
    assert states.model_states_bytes < 80e9 * 0.2  # 11.9 GB of model states on an 80 GB H800
    traffic = moe_layer_step(config.shape, config.layout, rank=1000)
    assert traffic.calls == 4 and traffic.group_size == 64
    assert traffic.nbytes == sum(a2a_bytes(config, MoEAssumptions()))  # 4 x T k h x 2 bytes, T = 4096
    assert traffic.nbytes == 4 * 4096 * 8 * 7168 * 2
    assert traffic.sent_bytes == pytest.approx(traffic.nbytes * 63 / 64)
    # what autograd saved for the routed experts: the estimator's term to the byte (well within 1 %)
    assert traffic.saved_bytes == routed_bytes(config.shape, 4096, 1)


@pytest.mark.parametrize("name", [r.name for r in moe_published.JUDGED])
def test_the_moe_half_of_a_layer_saves_the_estimate_within_1_percent(name: str) -> None:
    """The MoE half of one layer (a fused RMSNorm, the router, the shared expert, the rank's routed experts,
    dispatch and combine) forward and backward on the meta device: what autograd saved is chapter 7's
    `layer_bytes` less its attention, within 1 % (the estimate leaves out the norm's fp32 reciprocal RMS,
    T / tp values, and the top-k's int64 indices, T k / tp: 0.02 % of DeepSeek-V3's layer). With tp = 2
    (Megatron-Bridge's H100 row) both run Megatron-Core's sequence parallelism: the norm, router and routed
    copies on the rank's T / tp tokens, the shared expert F_s / tp wide on all T (its input all-gathered,
    only the rank's slice saved); before, the dry run ran the shared expert on T / tp tokens and the
    estimate the norm on T (-8.5 %)."""
    config = next(r for r in moe_published.JUDGED if r.name == name).config()
    tokens, tp = config.shape.seq, config.layout.size("tp")  # micro-batch 1, cp 1
    traffic = moe_layer_step(config.shape, config.layout, rank=config.layout.world_size - 1)
    est = layer_bytes(config.shape, True, tokens, tp, sequence_parallel=True) \
        - attention_bytes(config.shape, tokens, tp)
    assert traffic.layer_saved_bytes == pytest.approx(est, rel=0.01)
    mine = tokens // tp  # the rank's tokens under sequence parallelism
    extra = mine * 4 + mine * config.shape.moe.top_k * 8  # the reciprocal RMS, the top-k indices
    assert traffic.layer_saved_bytes - est == extra


def test_the_shared_expert_under_sequence_parallelism_saves_all_tokens_at_its_tp_width() -> None:
    """tp = 2: the shared expert's hidden values are T x F_s / 2 (what tp = 1 saves, halved), not
    T / 2 x F_s / 2; its gathered input is not saved."""
    row = next(r for r in moe_published.JUDGED if r.name == "bridge-deepseek-v3-h100")
    config = row.config()
    one = replace(config.layout, tp=1, dp=config.layout.size("dp") * 2)
    with_shared = {lay.size("tp"): moe_layer_step(config.shape, lay, rank=0).layer_saved_bytes
                   for lay in (config.layout, one)}
    bare = replace(config.shape, moe=replace(config.shape.moe, shared_experts=0))
    without = {lay.size("tp"): moe_layer_step(bare, lay, rank=0).layer_saved_bytes
               for lay in (config.layout, one)}
    assert with_shared[2] - without[2] == (with_shared[1] - without[1]) // 2


def test_fused_rms_norm_is_torchs_rms_norm_and_its_gradient() -> None:
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    want = torch.nn.functional.rms_norm(x, (8,), w, eps=FusedRMSNorm.EPS)
    torch.testing.assert_close(FusedRMSNorm.apply(x, w), want)
    assert torch.autograd.gradcheck(FusedRMSNorm.apply, (x, w))


def test_stage_modules_refuses_a_shape_it_does_not_build() -> None:
    config = moe_published.JUDGED[0].config()
    with pytest.raises(ValueError, match="published MoE shape"):
        stage_modules(replace(config.shape, bias=True), config.layout, 0)
