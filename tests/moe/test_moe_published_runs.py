"""Chapter 6: the published MoE runs as data (`published_runs`) and what they imply (`published_counts`):
parameters counted from each shape against the publisher's counts, layouts that tile their GPUs, experts
per rank and where each expert-parallel group lies."""

from __future__ import annotations

import dataclasses

import pytest

from distlab.moe.published_counts import (
    data_parallel,
    expert_placement,
    markdown_table,
    parameter_counts,
    table_rows,
)
from distlab.moe.published_runs import (
    DEEPSEEK_V3,
    PUBLISHED_RUNS,
    QWEN2_57B_A14B,
    QWEN3_30B_A3B,
    run,
)


def test_deepseek_v3_counts_671b_total_and_about_37b_active():
    count = parameter_counts(DEEPSEEK_V3)
    total, active = count.ratio()
    # 671.03B against 671B: the main model without the MTP module (its 11.5B are published apart).
    assert round(count.total / 1e9) == 671 and abs(total - 1) < 0.001
    # 37.55B against the README's 36.7B (the paper rounds to 37B): 2.3 % above. Both count the embedding
    # and the head (0.9B each) as active; the README does not break down the rest far enough to say
    # where the other 0.85B part (the book says so).
    assert 37.0e9 < count.active < 38.0e9 and 1.0 < active < 1.03


@pytest.mark.parametrize("shape, total_b, active_b", [(QWEN3_30B_A3B, 30.5, 3.35),
                                                      (QWEN2_57B_A14B, 57.4, 14.25)])
def test_other_shapes_count_what_their_names_say(shape, total_b, active_b):
    count = parameter_counts(shape)
    assert count.total / 1e9 == pytest.approx(total_b, abs=0.05)
    assert count.active / 1e9 == pytest.approx(active_b, abs=0.05)
    assert all(abs(r - 1) < 0.02 for r in count.ratio())


def test_every_published_layout_tiles_its_gpus():
    for r in PUBLISHED_RUNS:
        assert r.source and r.note is not None, r.name
        dp = data_parallel(r)
        if dp is None:  # the folding paper's rows: no layout published, said in the note
            assert "None rather than guessed" in r.note
            continue
        assert r.tp * r.cp * r.pp * dp == r.gpus, r.name
        place = expert_placement(r)
        assert place.edp * r.ep * (r.etp or r.tp) * r.pp == r.gpus, r.name
        if r.gradient_accumulation is not None:  # GBS = micro-batch x dp x accumulation steps
            assert r.global_batch == r.micro_batch * dp * r.gradient_accumulation, r.name


def test_deepseek_v3_experts_and_dispatch_group():
    place = expert_placement(run("deepseek-v3"))
    assert (place.dp, place.edp, place.experts_per_rank) == (128, 2, 4)
    assert (place.inside_node, place.nodes) == (False, 8)  # EP 64 spans 8 nodes of 8 H800
    b200 = expert_placement(run("bridge-deepseek-v3-b200"))
    assert (b200.experts_per_rank, b200.inside_node, b200.nodes) == (32, True, 1)
    assumed = expert_placement(run("mcore-mixtral-8x22b"))
    assert assumed.assumed == ("etp = tp (not published; Megatron-Core's default)",)


def test_rows_are_frozen_and_names_are_checked():
    with pytest.raises(dataclasses.FrozenInstanceError):
        run("deepseek-v3").gpus = 1
    with pytest.raises(ValueError, match=r"no published run named 'gpt-4'; choose one of deepseek-v3, "):
        run("gpt-4")


def test_the_table_shows_every_row_and_dashes_what_is_unpublished():
    rows = table_rows()
    assert len(rows) == len(PUBLISHED_RUNS) >= 3
    folding = rows[[r.name for r in PUBLISHED_RUNS].index("folding-mixtral-8x22b")]
    assert folding[2] == "not published" and folding[4] == "MFU 49.3%"
    assert "| DeepSeek-V3 | 2,048 H800 | TP1 CP1 PP16 EP64 ETP1 DP128 | 15,360 x 4,096 |" in markdown_table()
