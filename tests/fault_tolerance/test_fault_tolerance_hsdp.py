"""HSDP (chapter 11, part 1): a dp_replicate x dp_shard mesh, ZeRO-3 inside, an all-reduce across.

One launch of 4 ranks trains HSDP as (2, 2), (4, 1) and (1, 4) (chapter 7's plain ZeRO-3 over all
ranks) on an MLP whose widths do not divide by the shard size; every run must equal one process within
fp32 rounding, and (2, 2) must equal (1, 4). The bytes `comm_log` counts in each axis must equal the cost
model's prediction. The same launch trains a small GPT as (2, 2) with `default_blocks`, which must shard
each Transformer block as its own unit (the root keeping the embeddings and the final LayerNorm).
"""

from __future__ import annotations

import pytest
import torch

from distlab import launch, mesh, models, parity, reference
from distlab.fault_tolerance import cost_model
from distlab.fault_tolerance import parity as ft_parity
from distlab.fault_tolerance.hsdp import default_blocks

STEPS, BATCH = 3, 24
SHAPES = ((2, 2), (4, 1), (1, 4))


def _task() -> reference.Task:
    return reference.mlp_task(sizes=(6, 11, 5), n=96)


def _gpt_task() -> reference.Task:
    return reference.gpt_task(n_layer=2, n_embd=16, block_size=8, n=48)


def _all_layouts() -> dict:
    runs = {f"{r}x{s}": ft_parity.train_hsdp(_task(), r, s, STEPS, BATCH) for r, s in SHAPES}
    runs["gpt 2x2"] = ft_parity.train_hsdp(_gpt_task(), 2, 2, STEPS, 8)
    return runs


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return launch.run(_all_layouts, 4, deadline=120)


def test_hsdp_equals_one_process_and_plain_zero3(runs: list[dict]) -> None:
    ref = ft_parity.reference_run(_task(), STEPS, BATCH)
    for r, s in SHAPES:
        ft_parity.hsdp_report(runs[0][f"{r}x{s}"], ref, f"HSDP {r}x{s}").assert_passed()
    for rank in range(4):  # every rank gathered the same whole model
        assert parity.compare(runs[rank]["2x2"]["params"], runs[0]["2x2"]["params"]).passed
    parity.compare(runs[0]["2x2"]["params"], runs[0]["1x4"]["params"], label="HSDP 2x2",
                   against="ZeRO-3 over 4 ranks").assert_passed()


def test_measured_bytes_equal_the_cost_model(runs: list[dict]) -> None:
    for r, s in SHAPES:
        got = runs[0][f"{r}x{s}"]
        predicted = cost_model.hsdp_bytes(got["units"], r, s)
        assert got["bytes"] == pytest.approx(predicted), (r, s)
    across = cost_model.hsdp_bytes(runs[0]["2x2"]["units"], 2, 2)["replicate_sent"]
    assert 0 < across < cost_model.hsdp_bytes(runs[0]["1x4"]["units"], 1, 4)["shard_sent"]


def test_mesh_splits_dp_and_refuses_bad_axes() -> None:
    assert mesh.layout(dp_replicate=2, dp_shard=2) == {"dp_replicate": [[0, 2], [1, 3]],
                                                        "dp_shard": [[0, 1], [2, 3]]}
    axes = list(mesh.layout(pp=2, dp_replicate=2, dp_shard=2, tp=1))
    assert axes == ["pp", "dp_replicate", "dp_shard", "tp"]
    with pytest.raises(ValueError, match=r"dp=2 and dp_shard=2 both given; .* give dp, or both of them"):
        mesh.layout(dp=2, dp_shard=2)
    with pytest.raises(ValueError, match=r"dp_shard=2 given alone; HSDP needs both dp_replicate= and"):
        mesh.layout(dp_shard=2)


def test_default_blocks_are_the_gpts_transformer_blocks() -> None:
    gpt = _gpt_task().build(0)
    blocks = default_blocks(gpt)
    assert len(blocks) == gpt.config.n_layer == 2
    assert all(b is h and isinstance(b, models.Block) for b, h in zip(blocks, gpt.h, strict=True))
    assert default_blocks(_task().build(0)) == [], "an MLP has no ModuleList: it is one unit"


def test_hsdp_shards_a_gpt_block_by_block_and_equals_one_process(runs: list[dict]) -> None:
    gpt, got = _gpt_task().build(0), runs[0]["gpt 2x2"]
    root = [tuple(p.shape) for n, p in gpt.named_parameters() if not n.startswith("h.")]
    blocks = [[tuple(p.shape) for p in block.parameters()] for block in gpt.h]
    assert got["units"] == [root, *blocks], "one unit for the root, then one per block, in order"
    params = dict(got["params"])  # the tied lm_head is reported under both names; one process's once
    assert torch.equal(params.pop("lm_head.weight"), params["wte.weight"]), "lm_head and wte came untied"
    ref = ft_parity.reference_run(_gpt_task(), STEPS, 8)
    ft_parity.hsdp_report({**got, "params": params}, ref, "HSDP 2x2, GPT").assert_passed()
