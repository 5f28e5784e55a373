"""Chapter 9: the GPT trained with dp x pp x tp on one DeviceMesh equals one process, shard by shard, and
the bytes each rank records per mesh dim equal the cost model's. All world-size-4 shapes run inside one
launch of 4 ranks (a new grid each), world size 3 in one launch, and one 8-rank (2, 2, 2); world size 1
runs through the command line in test_parallel3d_errors.py.
Along the way: GPipe and 1F1B, ZeRO stages 0, 1 and 2, sequence parallelism on and off, an uneven
layer split (4 blocks on 3 stages), and `named_shards`, the contract the checkpoints build on."""

from __future__ import annotations

import pytest
import torch

from distlab import launch
from distlab.mesh import grid
from distlab.models import GPT, GPTConfig
from distlab.parallel3d import (
    Plan3D,
    block_ranges,
    build_stage,
    make_batches,
    named_shards,
    parity_3d,
    predicted_traffic,
    reference_run,
    train_3d,
)
from distlab.tensor_parallel import shard_state_dict

# n_head, n_embd and vocab_size divisible by 1, 2, 3 and 4; 4 blocks for up to 4 stages; T=12 for SP.
CONFIG = GPTConfig(vocab_size=24, block_size=12, n_layer=4, n_head=12, n_embd=24)
BATCH, SEQ, STEPS = 12, 12, 2
BATCHES = make_batches(CONFIG, BATCH, SEQ, STEPS, seed=3)

WORLD_4 = [Plan3D(dp=4, pp=1, tp=1, m=3, schedule="gpipe", zero_stage=0),
           Plan3D(dp=1, pp=4, tp=1, m=2, schedule="1f1b", zero_stage=0),
           Plan3D(dp=1, pp=1, tp=4, m=2, schedule="1f1b", zero_stage=1, sequence_parallel=True),
           Plan3D(dp=2, pp=2, tp=1, m=3, schedule="gpipe", zero_stage=2),
           Plan3D(dp=2, pp=1, tp=2, m=2, schedule="1f1b", zero_stage=1),
           Plan3D(dp=1, pp=2, tp=2, m=3, schedule="1f1b", zero_stage=2, sequence_parallel=True)]
WORLD_3 = [Plan3D(dp=3, pp=1, tp=1, m=2, zero_stage=2),
           Plan3D(dp=1, pp=3, tp=1, m=2, schedule="gpipe", zero_stage=1),  # blocks 0-1 | 2 | 3
           Plan3D(dp=1, pp=1, tp=3, m=1, zero_stage=0, sequence_parallel=True)]
WORLD_8 = [Plan3D(dp=2, pp=2, tp=2, m=3, schedule="1f1b", zero_stage=1, sequence_parallel=True)]


def _train_all(plans: list[Plan3D], with_shards: bool = False) -> tuple[list, list | None]:
    out = []
    for plan in plans:
        mesh = grid(dp=plan.dp, pp=plan.pp, tp=plan.tp)
        out.append(train_3d(mesh, CONFIG, plan, BATCHES, seed=7))
    return out, _shards() if with_shards else None


def _check(plans: list[Plan3D], world_size: int, with_shards: bool = False) -> list | None:
    both = launch.run(_train_all, world_size, plans, with_shards)
    results = [r for r, _ in both]
    ref = reference_run(CONFIG, BATCHES, seed=7)
    for i, plan in enumerate(plans):
        runs = [r[i] for r in results]
        parity = parity_3d(runs, ref, CONFIG, plan)
        assert parity.passed, parity
        assert parity.verdict().endswith("agree with one process within 1e-10: ok")
        names = {n for run in runs for n in run.params}
        assert names == set(ref.params), plan  # every dense parameter lives on some rank
        for run in runs:
            want = predicted_traffic(CONFIG, plan, BATCH, SEQ, run.coords["pp"], dtype_bytes=8)
            got = {k: (t.calls, t.sent_bytes, t.steps) for k, t in run.traffic.items()}
            assert got == {k: (t.calls, t.sent_bytes, t.steps) for k, t in want.items()}, (plan, run.coords)
            assert (run.losses is not None) == (run.coords["pp"] == plan.pp - 1)
    return [s for _, s in both]


def test_world_size_4_every_shape_in_one_launch_and_named_shards():
    per_rank = _check(WORLD_4, 4, with_shards=True)
    _check_named_shards(per_rank)


def test_world_size_3_with_an_uneven_pipeline():
    _check(WORLD_3, 3)  # world size 1: test_parallel3d_errors.py runs it through the command line


def test_world_size_8_two_by_two_by_two():
    _check(WORLD_8, 8)


def test_traffic_differs_by_axis_as_the_cost_model_says():
    plan = WORLD_8[0]
    first = predicted_traffic(CONFIG, plan, BATCH, SEQ, 0)
    last = predicted_traffic(CONFIG, plan, BATCH, SEQ, 1)
    assert ("pp", "send_fwd") in first and ("pp", "send_bwd") not in first
    assert ("pp", "send_bwd") in last and ("pp", "send_fwd") not in last
    act = BATCH // (plan.dp * plan.m) * (SEQ // plan.tp) * CONFIG.n_embd * 8
    assert first[("pp", "send_fwd")].sent_bytes == plan.m * act
    assert first[("pp", "tied_grad")].sent_bytes == CONFIG.vocab_size // plan.tp * CONFIG.n_embd * 8
    assert set(first) >= {("tp", "all_gather"), ("tp", "reduce_scatter"), ("dp", "reduce_scatter"),
                          ("dp", "all_gather")}
    plain = predicted_traffic(CONFIG, Plan3D(dp=2, pp=2, tp=2, m=3), BATCH, SEQ, 0)
    assert ("tp", "all_gather") not in plain and ("dp", "all_reduce") in plain


def _shards() -> list[list[tuple]]:
    mesh = grid(dp=1, pp=2, tp=2)
    torch.manual_seed(0)
    dense = GPT(CONFIG).double()
    model = build_stage(dense, mesh["pp"].get_group().rank(), 2, mesh["tp"].get_group())
    tp_rank = mesh["tp"].get_group().rank()
    want = shard_state_dict(dense.state_dict(), CONFIG, tp_rank, 2)
    return [(s.name, s.dim, s.chunks, s.tied_copy, tuple(s.stored()[0].shape),
             torch.equal(s.local, want[s.name])) for s in named_shards(model)]


def _check_named_shards(per_rank: list[list[tuple]]) -> None:
    """named_shards on grid(dp=1, pp=2, tp=2): dense names, chapter 5's shards, the tp dims."""
    for rank, shards in enumerate(per_rank):
        by_name = {s[0]: s for s in shards}
        assert all(s[5] for s in shards)  # the local tensor is chapter 5's shard of the dense tensor
        stage = rank // 2
        assert ("wpe.weight" in by_name) == (stage == 0) and ("ln_f.weight" in by_name) == (stage == 1)
        assert "wte.weight" in by_name and by_name["wte.weight"][3] == (stage == 1)
        block = 0 if stage == 0 else 2
        assert by_name[f"h.{block}.attn.c_attn.weight"][1:3] == (0, 3)
        assert by_name[f"h.{block}.attn.c_attn.weight"][4] == (3, 12, 24)  # stored as (3, n_embd/tp, n_embd)
        assert by_name[f"h.{block}.attn.c_proj.weight"][1] == 1
        assert by_name[f"h.{block}.mlp.c_fc.bias"][1] == 0
        assert by_name[f"h.{block}.ln_1.weight"][1] is None
        assert by_name["wte.weight"][1:3] == (0, 1) and by_name["wte.weight"][4] == (12, 24)


@pytest.mark.parametrize("n_layer, pp, sizes", [(4, 3, [2, 1, 1]), (5, 2, [3, 2]), (4, 4, [1, 1, 1, 1])])
def test_block_ranges_split_unevenly_larger_first(n_layer, pp, sizes):
    ranges = block_ranges(n_layer, pp)
    assert [len(r) for r in ranges] == sizes and ranges[-1].stop == n_layer
