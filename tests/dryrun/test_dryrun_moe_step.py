"""Chapter 12's whole pipeline stage of a published MoE layout on the meta device and the fake process group:
one rank's 1F1B step, its point-to-point messages and all-to-alls against chapter 9's cost model
(`plan.moe_traffic.p2p_bytes`, `a2a_bytes`) and what it holds against chapter 7's estimate
(`moe_activations.moe_stage_peaks`), within 1 %, on the first, a middle and the last stage."""

from __future__ import annotations

import pytest

from distlab.dryrun.moe_step import stage_step
from distlab.layout import Layout
from distlab.memory.estimate.moe_activations import head_bytes, moe_stage_peaks
from distlab.memory.estimate.moe_savings import DEEPSEEK_V3_SAVINGS
from distlab.plan import moe_published
from distlab.plan.moe_cost import MoEAssumptions
from distlab.plan.moe_traffic import a2a_bytes, p2p_bytes


def _config(name: str):  # type: ignore[no-untyped-def]
    return next(r for r in moe_published.JUDGED if r.name == name).config()


def _rank(layout: Layout, stage: int) -> int:
    """The last rank of `stage` (pp is the outermost axis)."""
    per = layout.world_size // layout.size("pp")
    return stage * per + per - 1


@pytest.mark.parametrize("stage", [0, 1, 8, 15])
def test_deepseek_v3_stage_holds_the_estimate_within_1_percent(stage: int) -> None:
    """p micro-batches, so that every stage holds its 1F1B worst case (p - k in flight). The model states are
    the estimate to the byte; the activations differ by the RMSNorms' fp32 RMS and the top-k indices the
    estimate leaves out (< 0.02 %). Before the estimate counted the head, the last stage was 9.5 % under."""
    c = _config("deepseek-v3")
    pp = c.layout.size("pp")
    got = stage_step(c.shape, c.layout, _rank(c.layout, stage), microbatches=pp)
    want = moe_stage_peaks(c.shape, c.layout, 1, pp, zero=1)[stage]
    assert got.stage == stage and got.in_flight == pp - stage
    assert got.model_states == want.model_states
    assert got.buffers == want.dispatch
    assert got.activations == pytest.approx(want.activations, rel=0.01)
    assert got.total == pytest.approx(want.peak_bytes, rel=0.01)


def test_deepseek_v3_messages_and_all_to_alls_are_the_cost_models() -> None:
    """Stage 1 (4 MoE layers) of 6 micro-batches: 6 activations sent on, 6 gradients sent back, each b s h
    bf16 values, and 4 all-to-alls of T k h bf16 values per MoE layer and micro-batch."""
    c, m = _config("deepseek-v3"), 6
    got = stage_step(c.shape, c.layout, _rank(c.layout, 1), microbatches=m)
    one = 4096 * 7168 * 2
    assert got.sends == p2p_bytes(c, 1, m) == {"fwd": (m, m * one), "bwd": (m, m * one)}
    assert got.receives == got.sends
    assert got.a2a_calls == 4 * 4 * m
    assert got.a2a_bytes == 4 * m * sum(a2a_bytes(c, MoEAssumptions()))


def test_first_and_last_stage_send_one_way() -> None:
    c, m = _config("deepseek-v3"), 3
    first = stage_step(c.shape, c.layout, 0, microbatches=m)
    last = stage_step(c.shape, c.layout, c.layout.world_size - 1, microbatches=m)
    assert first.sends == p2p_bytes(c, 0, m) and first.sends["bwd"] == (0, 0)
    assert last.sends == p2p_bytes(c, 15, m) and last.sends["fwd"] == (0, 0)
    assert first.a2a_calls == 0 and first.buffers == 0  # stage 0 holds the 3 dense layers only


@pytest.mark.parametrize("name", ["bridge-deepseek-v3-b200", "bridge-qwen3-30b-a3b-h100",
                                  "bridge-deepseek-v3-h100"])
def test_the_other_judged_rows_hold_the_estimate_within_1_percent(name: str) -> None:
    """The last stage of each (the H100 row runs tp = 2 under sequence parallelism: its messages are
    b s h / tp bf16 values)."""
    c = _config(name)
    pp = c.layout.size("pp")
    got = stage_step(c.shape, c.layout, _rank(c.layout, pp - 1), microbatches=pp)
    want = moe_stage_peaks(c.shape, c.layout, 1, pp, zero=1)[pp - 1]
    assert got.model_states == want.model_states
    assert got.total == pytest.approx(want.peak_bytes, rel=0.01)
    assert got.sends == p2p_bytes(c, pp - 1, pp)


def test_head_bytes_by_hand() -> None:
    """DeepSeek-V3's last stage, one 4,096-token micro-batch: the final norm's input and output (bf16) and
    the fp32 softmax over 129,280 logits."""
    ms = _config("deepseek-v3").shape
    assert head_bytes(ms, 4096, 1) == 4096 * 7168 * 2 * 2 + 4096 * 129_280 * 4


@pytest.mark.parametrize("stage", [0, 1])
def test_tp2_stage_under_sequence_parallelism_holds_the_estimate_within_1_percent(stage: int) -> None:
    """Megatron-Bridge's H100 row (tp 2, pp 8, ep 64) with 8 micro-batches: stage 0 (the embedding's partial
    sums reduce-scattered, 3 dense and 4 MoE layers) and stage 1; messages of b s h / tp bf16 values."""
    c = _config("bridge-deepseek-v3-h100")
    got = stage_step(c.shape, c.layout, _rank(c.layout, stage), microbatches=8)
    want = moe_stage_peaks(c.shape, c.layout, 1, 8, zero=1)[stage]
    assert got.in_flight == 8 - stage and got.model_states == want.model_states
    assert got.buffers == want.dispatch
    one = 2048 * 7168 * 2
    back = 8 if stage > 0 else 0
    assert got.sends == p2p_bytes(c, stage, 8) == {"fwd": (8, 8 * one), "bwd": (back, back * one)}
    assert got.total == pytest.approx(want.peak_bytes, rel=0.01)


def test_bad_layouts_and_sizes_are_refused() -> None:
    tp2 = _config("bridge-deepseek-v3-h100")
    with pytest.raises(ValueError, match="with tp=1"):
        stage_step(tp2.shape, tp2.layout, 0, savings=DEEPSEEK_V3_SAVINGS)
    c = _config("deepseek-v3")
    with pytest.raises(ValueError, match="microbatches"):
        stage_step(c.shape, c.layout, 0, microbatches=0)
    with pytest.raises(ValueError, match="rank=2048"):
        stage_step(c.shape, c.layout, 2048, microbatches=1)
    with pytest.raises(ValueError, match="stage=16"):
        p2p_bytes(c, 16)
