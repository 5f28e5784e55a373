"""Chapter 7's estimator for a mixture of experts: model states per rank under parallel folding against
the bytes real ranks hold (a `FoldedMoEBlock` on 1-4 gloo ranks), the dispatch buffer against the rows a
rank sends, and DeepSeek-V3's rank under its published layout against a hand derivation."""

from __future__ import annotations

import pytest
import torch

from distlab import launch
from distlab.expert_fold import ExpertFold
from distlab.layout import Layout
from distlab.memory.estimate.moe_states import dispatch_bytes, layer_params, moe_states, stage_params
from distlab.model_shape import ModelShape
from distlab.moe.published_runs import DEEPSEEK_V3
from distlab.moe_shape import MoEShape

D, HEADS, F, E, K = 16, 4, 24, 8, 2
LAYOUTS = {1: [(1, 1)], 2: [(1, 2), (2, 2), (2, 1)], 4: [(2, 4), (2, 2), (1, 4), (4, 2)]}  # (tp, ep)


def _block_shape() -> ModelShape:
    """`FoldedMoEBlock`'s block as a model shape: GPT attention and LayerNorms with biases, GELU experts."""
    return ModelShape(layers=1, hidden=D, heads=HEADS, vocab=1, seq=1, positions=False, bias=True,
                      moe=MoEShape(experts=E, top_k=K, expert_ffn=F))


def _measure(world: int) -> list[dict]:
    from distlab.moe.folded_block import FoldedMoEBlock, MoEBlock
    from distlab.moe.folding import fold_meshes

    out = []
    for tp, ep in LAYOUTS[world]:
        meshes = fold_meshes(tp=tp, ep=ep)
        torch.manual_seed(0)
        ref = MoEBlock(D, HEADS, F, E, K, capacity_factor=4.0)
        block = FoldedMoEBlock.from_reference(ref, meshes)
        x = torch.randn(2, 6, D)
        res = block(x)
        (res.y.square().mean() + res.aux_loss).backward()
        opt = torch.optim.Adam(block.parameters())
        opt.step()
        experts = {id(p) for p in block.expert_parameters()}
        params = list(block.parameters())
        out.append({
            "tp": tp, "ep": ep,
            "dense": sum(p.numel() for p in params if id(p) not in experts),
            "experts": sum(p.numel() for p in params if id(p) in experts),
            "params_bytes": sum(p.numel() * p.element_size() for p in params),
            "grads_bytes": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
            "adam_bytes": sum(t.numel() * t.element_size() for st in opt.state.values()
                              for n, t in st.items() if n != "step"),
        })
    return out


@pytest.mark.ranks
@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_model_states_equal_the_bytes_real_ranks_hold(world: int) -> None:
    ms = _block_shape()
    for rank in launch.run(_measure, world, world, timeout=120):
        for m in rank:
            layout = Layout(dp=world // m["tp"], tp=m["tp"], experts=ExpertFold(m["ep"]))
            assert layer_params(ms, True, m["tp"], m["ep"], 1) == (m["dense"], m["experts"]), m
            est = moe_states(ms, layout, zero=0, precision="fp32", ends=False)
            assert (est.params_bytes, est.grads_bytes, est.optimizer_bytes) == (
                m["params_bytes"], m["grads_bytes"], m["adam_bytes"]), m


def test_dispatch_buffer_is_tokens_times_k_rows_each_way() -> None:
    assert dispatch_bytes(4096, 8, 7168) == 4 * 4096 * 8 * 7168 * 2
    assert dispatch_bytes(10, 2, 16, 4, capacity_factor=1.25) == 2 * 2.25 * 10 * 2 * 16 * 4
    with pytest.raises(ValueError, match="capacity_factor"):
        dispatch_bytes(10, 2, 16, capacity_factor=0)


def test_zero1_shards_dense_states_over_dp_and_experts_over_edp() -> None:
    ms = _block_shape()
    layout = Layout(dp=4, tp=2, experts=ExpertFold(ep=2))  # 8 ranks: dp 4 for attention, edp 4 for experts
    dense, experts = layer_params(ms, True, 2, 2, 1)
    est = moe_states(ms, layout, zero=1, precision="mixed", ends=False)
    assert est.optimizer_bytes == 12 * dense / 4 + 12 * experts / 4
    uneven = Layout(dp=2, tp=4, experts=ExpertFold(ep=2))  # attention dp 2, experts edp 4
    assert moe_states(ms, uneven, zero=1, ends=False).optimizer_bytes == \
        12 * layer_params(ms, True, 4, 2, 1)[0] / 2 + 12 * experts / 4


def test_deepseek_v3_rank_under_its_published_layout_by_hand() -> None:
    """2,048 H800: pp 16, ep 64 (etp 1), attention dp 128 (tp 1), edp 2048 / (16 x 64) = 2; 61 layers cut
    3 / 4 x 14 / 3 (`stage_layers`), the 3 dense layers on stage 0 (DeepSeek-AI 2024, secs. 3.2, 4.2)."""
    ms = DEEPSEEK_V3.model_shape()
    layout = Layout(dp=128, pp=16, tp=1, cp=1, experts=ExpertFold(ep=64))
    assert layout.world_size == 2048 and layout.edp == 2
    h, a, v = 7168, 128, 129_280
    mla = (h * 1536 + 1536 + 1536 * a * (128 + 64) + h * (512 + 64) + 512 + 512 * a * (128 + 128)
           + a * 128 * h)
    norms, swiglu = 2 * h, 3 * h
    dense_layer = mla + norms + swiglu * 18_432
    moe_dense = mla + norms + h * 256 + swiglu * 2048  # router and the shared expert, on every rank
    moe_experts = 256 // 64 * swiglu * 2048  # 4 routed experts per rank
    stages = stage_params(ms, layout)
    assert stages[0] == (3 * dense_layer + v * h, 0)
    assert stages[1] == (4 * moe_dense, 4 * moe_experts)
    assert stages[15] == (3 * moe_dense + v * h + h, 3 * moe_experts)
    assert stages[0][0] == 2_677_129_216  # the rank that holds the most parameters: 2.68B, stage 0
    est = moe_states(ms, layout, zero=1)  # BF16 weights and gradients, FP32 Adam, ZeRO-1 over dp / edp
    last_dense, last_experts = stages[15]
    assert est.stage == 15  # the most bytes: its experts' optimizer state is sharded over edp = 2 only
    want = 4 * (last_dense + last_experts) + 12 * (last_dense / 128 + last_experts / 2)
    assert est.model_states_bytes == want
    assert 11.9e9 < est.model_states_bytes < 12.0e9


def test_bad_expert_layout_names_the_fix() -> None:
    with pytest.raises(ValueError, match="choose ep x etp among"):
        Layout(dp=6, pp=1, experts=ExpertFold(ep=4))
    with pytest.raises(ValueError, match="either the ep axis"):
        Layout(dp=2, ep=2, experts=ExpertFold(ep=2))
    with pytest.raises(ValueError, match="ep=3 does not divide experts=8"):
        moe_states(_block_shape(), Layout(dp=3, experts=ExpertFold(ep=3)))
    with pytest.raises(ValueError, match="top_k=9 exceeds experts=8"):
        MoEShape(experts=8, top_k=9, expert_ffn=4)


def test_mla_layer_activations_by_hand_and_deepseek_v3_needs_its_recomputation() -> None:
    """One DeepSeek-V3 MoE layer, 4,096 tokens, tp 1, BF16, nothing recomputed (moe_activations'
    approximation): MLA's latents and heads, the router's fp32 probabilities, 8 routed SwiGLU copies (each
    with its returned row and gate) and the shared expert. Under its published layout a 1F1B rank would
    hold ~162 GB, more than the H800's 80: DeepSeek-V3 needs its recomputation (sec. 3.2.3) and FP8
    caching (sec. 3.3.4), which this leaves out."""
    from distlab.memory.estimate.moe_activations import attention_bytes, layer_bytes, moe_peak_bytes

    ms, t, h = DEEPSEEK_V3.model_shape(), 4096, 7168
    mla = 2 * t * h * 2 + t * (2 * 1536 + 2 * 512 + 64) * 2 + t * 128 * (2 * 192 + 2 * 128) * 2 + t * 128 * 4
    assert attention_bytes(ms, t, 1) == mla
    moe = 2 * t * h * 2 + t * 256 * 4 + t * 8 * (h + 4 * 2048 + h + 1) * 2 + t * 4 * 2048 * 2
    assert layer_bytes(ms, True, t, 1) == mla + moe
    layout = Layout(dp=128, pp=16, tp=1, cp=1, experts=ExpertFold(ep=64))
    peak = moe_peak_bytes(ms, layout, micro_batch=1, microbatches=120)
    assert peak.stage == 1 and peak.activations == 15 * 4 * (mla + moe)  # 15 micro-batches in flight
    assert 160e9 < peak.peak_bytes < 165e9
