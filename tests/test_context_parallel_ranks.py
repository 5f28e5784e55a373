"""Chapter 10 on ranks: ring attention against dense causal attention at 2, 3 and 4 ranks, both layouts,
float64, outputs and gradients, with the work and the bytes of every rank against the formulas; an
uneven length padded; the course GPT and the memory measurement (2 ranks); and the cp sub-groups of a
2 x 2 mesh (4 ranks). One launch per world size (world size 1 is in test_context_parallel.py)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from distlab import launch
from distlab.context_parallel import cost_model
from distlab.context_parallel.parity import CPParityReport, attention_parity

TOL = 1e-12  # float64
SHAPE = {"batch": 2, "heads": 2, "head_dim": 8}


def _on_ranks(seq_len: int, uneven: int, extras: bool) -> dict:
    from distlab.context_parallel.memory import measured_ring_bytes
    from distlab.context_parallel.parity import gpt_parity
    from distlab.mesh import grid

    layouts = ("zigzag", "contiguous")
    out = {"even": [attention_parity(layout, seq_len=seq_len, **SHAPE) for layout in layouts],
           "padded": [attention_parity(layout, seq_len=uneven, pad=True, **SHAPE)
                      for layout in ("zigzag", "contiguous")]}
    if extras:
        out["gpt"] = [gpt_parity(layout, seq_len=16) for layout in ("zigzag", "contiguous")]
        out["memory"] = measured_ring_bytes(seq_len, 1, 2, 8, "zigzag")
    if dist.get_world_size() == 4:  # the same 4 ranks as dp=2 x cp=2: each cp pair runs its own ring
        group = grid(dp=2, cp=2)["cp"].get_group()
        out["sub"] = [attention_parity(layout, seq_len=16, group=group, **SHAPE) for layout in layouts]
    return out


def _check_reports(reports: list[CPParityReport], p: int, seq_len: int) -> None:
    for rep in reports:
        assert max(rep.max_error.values()) <= TOL, rep
        r = rep.rank
        assert rep.blocks["full"] + rep.blocks["diagonal"] == cost_model.blocks_per_rank(p, rep.layout)[r]
        assert rep.blocks["skip"] == cost_model.skipped_per_rank(p, rep.layout)[r]
        # entries of Q K^T per batch element and head
        assert rep.score_entries == cost_model.score_entries_per_rank(p, seq_len, rep.layout)[r]
        sent = cost_model.bytes_per_rank(p, seq_len, SHAPE["batch"], SHAPE["heads"], SHAPE["head_dim"], 8)
        assert (rep.bytes_forward, rep.bytes_backward) == (sent["forward"], sent["backward"])


@pytest.mark.parametrize(("p", "seq_len", "uneven"), [(2, 24, 21), (3, 24, 23), (4, 32, 30)])
def test_ring_attention_on_ranks(p: int, seq_len: int, uneven: int) -> None:
    results = launch.run(_on_ranks, p, seq_len, uneven, p == 2)
    for r, res in enumerate(results):
        assert [rep.rank for rep in res["even"]] == [r, r]
        _check_reports(res["even"], p, seq_len)
        for rep in res["padded"]:
            assert max(rep.max_error.values()) <= TOL, rep
            padded = cost_model.bytes_per_rank(p, -(-uneven // (2 * p)) * 2 * p if rep.layout == "zigzag"
                                               else -(-uneven // p) * p, 2, 2, 8, 8)
            assert rep.bytes_forward == padded["forward"]
    if p == 4:  # positions within the cp pair, and every pair's ring equals dense attention
        assert [[rep.rank for rep in res["sub"]] for res in results] == [[0, 0], [1, 1], [0, 0], [1, 1]]
        for res in results:
            _check_reports(res["sub"], 2, 16)
    if p == 2:
        for res in results:
            assert all(g.worst() <= TOL for g in res["gpt"])
            assert res["memory"] == cost_model.attention_saved_bytes(2, seq_len, 1, 2, 8, 8)
