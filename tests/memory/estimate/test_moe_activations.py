"""Chapter 7's MoE activation estimate under sequence parallelism: with tp > 1 Megatron-Core runs an MoE
layer's RMSNorm on the rank's T / tp tokens (it requires sequence parallelism with tp > 1 and experts), as
chapter 12's dry run of the layer measures it (`tests/dryrun/test_dryrun_moe.py`)."""

from __future__ import annotations

from distlab.memory.estimate.moe_activations import layer_bytes, moe_peak_bytes
from distlab.plan import moe_published


def _bridge_h100():
    return next(r for r in moe_published.JUDGED if r.name == "bridge-deepseek-v3-h100").config()


def test_sequence_parallelism_puts_the_moe_norm_on_the_ranks_tokens() -> None:
    config = _bridge_h100()
    ms, t, tp = config.shape, config.shape.seq, config.layout.size("tp")
    assert tp == 2
    whole = layer_bytes(ms, True, t, tp)
    split = layer_bytes(ms, True, t, tp, sequence_parallel=True)
    assert whole - split == (t - t / tp) * ms.hidden * (2 + 2)  # the norm's input and output, BF16
    # a dense layer's MLP is not the MoE's: its norm stays on T either way
    assert layer_bytes(ms, False, t, tp, sequence_parallel=True) == layer_bytes(ms, False, t, tp)
    # with tp = 1 there is nothing to split
    assert layer_bytes(ms, True, t, 1, sequence_parallel=True) == layer_bytes(ms, True, t, 1)


def test_the_peak_of_a_tp_2_layout_uses_sequence_parallelism_by_default() -> None:
    config = _bridge_h100()
    default = moe_peak_bytes(config.shape, config.layout)
    assert default == moe_peak_bytes(config.shape, config.layout, sequence_parallel=True)
    without = moe_peak_bytes(config.shape, config.layout, sequence_parallel=False)
    assert without.activations > default.activations and without.model_states == default.model_states


def test_qk_norms_inputs_are_counted() -> None:
    """Qwen3's per-head RMSNorms of q and k keep their inputs, the q and k projections' outputs, T (a + a_kv)
    d_h values (/ tp): 6 % of Qwen3-30B-A3B's layer, which chapter 12's whole-layer dry run measured."""
    from dataclasses import replace

    from distlab.memory.estimate.moe_activations import attention_bytes

    ms = next(r for r in moe_published.JUDGED if r.name == "bridge-qwen3-30b-a3b-h100").config().shape
    plain = replace(ms, moe=replace(ms.moe, qk_norm=False))
    t = ms.seq
    assert attention_bytes(ms, t, 1) - attention_bytes(plain, t, 1) == t * (32 + 4) * 128 * 2
    assert attention_bytes(ms, t, 2) - attention_bytes(plain, t, 2) == t * (32 + 4) * 128 * 2 / 2
