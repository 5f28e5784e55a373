"""DeepSeek-V3's activation savings as options of the MoE estimate (`moe_savings`): recomputation of the
RMSNorms and MLA's up-projections (DeepSeek-AI 2024, sec. 3.2.3) and FP8 caching of the linear layers'
inputs (sec. 3.3.3), checked term by term by hand on one DeepSeek-V3 layer and on chapter 6's block (which
cannot recompute its norms, so its option is checked by arithmetic), and the published rank's peak with and
without them against the H800's 80 GB."""

from __future__ import annotations

import pytest

from distlab.expert_fold import ExpertFold
from distlab.layout import Layout
from distlab.memory.estimate.moe_activations import attention_bytes, layer_bytes, moe_peak_bytes
from distlab.memory.estimate.moe_block_activations import BlockShape, balanced_rows, block_terms
from distlab.memory.estimate.moe_savings import DEEPSEEK_V3_SAVINGS, FP8_BYTES, Savings
from distlab.moe.published_runs import DEEPSEEK_V3

T, H, A = 4096, 7168, 128  # one micro-batch of one sequence; DeepSeek-V3's width and heads


def test_one_deepseek_v3_moe_layer_with_both_savings_by_hand() -> None:
    ms = DEEPSEEK_V3.model_shape()
    # kept: the norm's input, the two latents with the rope key (BF16), the attention output in E5M6, the LSE
    attention = T * H * 2 + T * (1536 + 512 + 64) * 2 + T * A * 128 * 1.5 + T * A * 4
    assert attention_bytes(ms, T, 1, savings=DEEPSEEK_V3_SAVINGS) == pytest.approx(attention)
    # the MoE norm's input; fp32 router probabilities; per copy of 8: the expert's input in FP8, the returned
    # row and its gate in BF16, the SwiGLU's two inputs in FP8; the shared expert's SwiGLU inputs in FP8
    moe = T * H * 2 + T * 256 * 4 + 8 * T * (H * FP8_BYTES + (H + 1) * 2 + 2 * 2048 * FP8_BYTES) \
        + T * 2 * 2048 * FP8_BYTES
    assert layer_bytes(ms, True, T, 1, savings=DEEPSEEK_V3_SAVINGS) == pytest.approx(attention + moe)


def test_recomputation_alone_drops_exactly_the_recomputed_outputs() -> None:
    ms = DEEPSEEK_V3.model_shape()
    dropped = 2 * T * H * 2 + T * (1536 + 512) * 2 + T * A * (2 * 192 + 128) * 2  # norms' outputs, q k v
    assert layer_bytes(ms, True, T, 1) - layer_bytes(ms, True, T, 1, savings=Savings(recompute=True)) \
        == pytest.approx(dropped)


def test_the_blocks_norm_recomputation_by_hand() -> None:
    """Chapter 6's block cannot recompute its LayerNorms (no hook, and its behaviour stays): the option
    drops the two outputs (T h each) and their mean and deviation (T each, twice), and keeps the inputs."""
    s = BlockShape(2, 6, 16, 4, 24, 8, 2, tp=2, ep=2, e=4)
    rows = balanced_rows(s)
    full, saved = block_terms(s, *rows), block_terms(s, *rows, recompute_norms=True)
    assert sum(full.values()) - sum(saved.values()) == 2 * 12 * 16 * 4 + 2 * 2 * 12 * 4
    assert saved["norms"] == 2 * 12 * 16 * 4  # the inputs, kept for the recomputation


def test_deepseek_v3_rank_fits_80_gb_only_with_both_savings() -> None:
    """Its published layout (pp 16, ep 64, dp 128, 1F1B with 15 micro-batches in flight on stage 1): 162 GB
    with nothing saved, 122 GB with recomputation, 119 GB with FP8 caching, 79.3 GB with both."""
    ms = DEEPSEEK_V3.model_shape()
    layout = Layout(dp=128, pp=16, tp=1, cp=1, experts=ExpertFold(ep=64))
    peaks = {(r, f): moe_peak_bytes(ms, layout, microbatches=120, savings=Savings(r, f)).peak_bytes
             for r in (False, True) for f in (False, True)}
    assert peaks[(False, False)] > peaks[(True, False)] > peaks[(False, True)] > 80e9 > peaks[(True, True)]
    assert 79e9 < peaks[(True, True)] < 79.5e9


def test_bad_savings_name_the_fix() -> None:
    with pytest.raises(ValueError, match="recompute='yes' must be True or False"):
        Savings(recompute="yes")
