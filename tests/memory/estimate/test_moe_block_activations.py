"""Chapter 7's estimator for a mixture of experts against a measured step: the bytes chapter 6's folded MoE
block (`FoldedMoEBlock`) saves for backward on each of 1, 2 and 4 gloo ranks, under several foldings
(tp 1/2/4, ep 1/2/4), top-1 and top-2 routing, with and without dropped tokens, in float32 and bfloat16,
against `moe_block_activations.block_saved_bytes` fed the measured per-expert token counts (the routing
is uneven: the estimate takes what the router did as input)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from distlab import launch
from distlab.memory.estimate.moe_block_activations import (
    GENERIC,
    BlockShape,
    balanced_rows,
    block_saved_bytes,
    block_terms,
    rank_rows,
)

D, HEADS, F, E, B, S = 16, 4, 24, 8, 2, 6
# (tp, ep, k, capacity_factor, dtype): capacity 4 drops nothing, 1.0 drops some under the uneven routing
CASES = {
    1: [(1, 1, 1, 4.0, "float32"), (1, 1, 2, 1.0, "float32"), (1, 1, 2, 4.0, "bfloat16")],
    2: [(1, 2, 2, 4.0, "float32"), (2, 2, 1, 1.0, "float32"), (2, 1, 2, 4.0, "bfloat16")],
    4: [(2, 4, 2, 4.0, "float32"), (2, 2, 1, 1.0, "bfloat16"), (1, 4, 1, 4.0, "float32"),
        (4, 2, 2, 1.0, "float32")],
}


def _measure(world: int) -> list[dict]:
    import torch.distributed as dist

    from distlab.memory.measure.accounting import saved_activation_bytes
    from distlab.moe.folded_block import FoldedMoEBlock, MoEBlock
    from distlab.moe.folding import fold_meshes

    out = []
    for tp, ep, k, cf, dtype in CASES[world]:
        meshes = fold_meshes(tp=tp, ep=ep)
        torch.manual_seed(0)
        ref = MoEBlock(D, HEADS, F, E, k, capacity_factor=cf).to(getattr(torch, dtype))
        block = FoldedMoEBlock.from_reference(ref, meshes)
        torch.manual_seed(1 + dist.get_rank() // tp)  # one batch per dp replica
        x = torch.randn(B, S, D, dtype=getattr(torch, dtype))
        held = {}

        def step(block=block, x=x, held=held) -> None:
            held["out"] = block(x)

        saved = saved_activation_bytes(step, block.parameters())
        counts = held["out"].routings[0].tokens_per_expert().tolist()
        out.append({"tp": tp, "ep": ep, "k": k, "cf": cf, "dtype": dtype, "rank": dist.get_rank(),
                    "saved": saved, "counts": counts})
    return out


@pytest.mark.ranks
@pytest.mark.parametrize("world", sorted(CASES))
def test_saved_bytes_within_1_percent_of_the_measured_step_on_every_rank(world: int) -> None:
    ranks = launch.run(_measure, world, world, timeout=180)
    for i, case in enumerate(CASES[world]):
        tp, ep, k, _, dtype = case
        got = [r[i] for r in ranks]
        s = BlockShape(B, S, D, HEADS, F, E, k, tp=tp, ep=ep, e=2 if dtype == "bfloat16" else 4)
        for m in got:
            group = [g["counts"] for g in got if g["rank"] // ep == m["rank"] // ep]
            sent, received = rank_rows(group, m["rank"] % ep)
            est = block_saved_bytes(s, sent, received, tp_rank=m["rank"] % tp)
            assert abs(est - m["saved"]) <= 0.01 * m["saved"], (case, m, block_terms(s, sent, received))


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("k", [1, 2])
def test_the_general_moe_layer_estimate_is_the_blocks_generic_terms(tp: int, k: int) -> None:
    """`moe_activations.layer_bytes` on the block's shape (GELU experts, fp32, balanced routing) counts
    exactly the block's GENERIC terms: the router's probabilities on the rank's T / tp tokens (it counted
    all T before), and the returned row of each routed copy that the combine weights by its gate (missing
    before). The rest (indices, LayerNorm statistics, the z-loss's logits, ...) is this implementation's."""
    from distlab.memory.estimate.moe_activations import layer_bytes
    from tests.memory.estimate.test_moe_states import _block_shape

    s = BlockShape(B, S, D, HEADS, F, E, k, tp=tp, ep=2, e=4)
    terms = block_terms(s, *balanced_rows(s))
    ms = _block_shape()
    ms = replace(ms, moe=replace(ms.moe, top_k=k))
    assert layer_bytes(ms, True, B * S, tp, e=4) == sum(terms[n] for n in GENERIC)
