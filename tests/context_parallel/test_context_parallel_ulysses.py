"""DeepSpeed-Ulysses (Jacobs et al. 2023) and its hybrid with the ring (USP, Fang & Zhao 2024).

Without ranks: one process (p = 1) against dense attention, the head constraint's errors, and the cost
model's bytes and times. On ranks, in ONE launch of 4 (a rank start costs seconds): Ulysses against dense
causal attention, forward and backward, float64, on the whole world (p = 4), on the cp pairs of a
dp=2 x cp=2 mesh (p = 2), on ranks 0-2 (p = 3, rank 3 watches), both layouts, with multi-head and
grouped-query heads; the hybrid u = 2 x r = 2; Ulysses' output and gradients against the ring's on the
same shards; and the bytes `comm_log` counts for both against the cost model.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab import launch
from distlab.context_parallel import cost_model
from distlab.context_parallel.parity import ulysses_parity
from distlab.context_parallel.ulysses import check_heads, ulysses_attention


def test_one_process_and_gqa() -> None:
    for heads, kv in ((4, 4), (6, 2)):
        assert ulysses_parity("zigzag", heads=heads, kv_heads=kv, seq_len=10).passed
    assert ulysses_parity("contiguous", heads=3, kv_heads=1, seq_len=7).passed


def test_heads_must_divide() -> None:
    with pytest.raises(ValueError, match=r"heads=6 is not divisible by the Ulysses group's size p=4.*"
                                         r"choose p among \[1, 2, 3, 6\].*ring_group"):
        check_heads(6, 6, 4)
    with pytest.raises(ValueError, match=r"kv_heads=2 is not divisible by the Ulysses group's size p=4"):
        check_heads(8, 2, 4)
    with pytest.raises(ValueError, match=r"heads=6 is not a multiple of kv_heads=4"):
        check_heads(6, 4, 2)
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"q must be \(B, a, S_local, d\).*split heads before"):
        ulysses_attention(q, q[0], q[0])


def test_cost_model() -> None:
    L, b, a, d, e = 4096, 1, 32, 128, 2
    for p in (1, 2, 4, 8):
        uly = cost_model.ulysses_bytes_per_rank(p, L, b, a, a, d, e)
        ring = cost_model.bytes_per_rank(p, L, b, a, d, e)
        assert uly["forward"] == uly["backward"] == (p - 1) / p * 4 * b * a * (L // p) * d * e
        assert uly["forward"] * p == pytest.approx(2 * ring["forward"])  # 2/p of the ring's, multi-head
    gqa = cost_model.ulysses_bytes_per_rank(8, L, b, a, 8, d, e)["forward"]
    assert gqa == 7 / 8 * (2 * a + 16) * (L // 8) * d * e
    # the hybrid with u = 1 is the ring, with r = 1 it is Ulysses
    ring_only = cost_model.hybrid_bytes_per_rank(1, 8, L, b, a, a, d, e)
    assert ring_only["ulysses"] == 0
    assert ring_only["ring_forward"] == cost_model.bytes_per_rank(8, L, b, a, d, e)["forward"]
    assert cost_model.hybrid_bytes_per_rank(8, 1, L, b, a, a, d, e)["ulysses"] == gqa * 4 * a / (2 * a + 16)
    kw = {"seq_len": L, "batch": b, "heads": a, "kv_heads": a, "head_dim": d, "dtype_bytes": e,
          "flops_per_s": 1e15, "intra_GBps": 450.0, "inter_GBps": 50.0}
    ring_t = cost_model.cp_attention_time("ring", r=8, **kw)
    uly_t = cost_model.cp_attention_time("ulysses", u=8, **kw)
    hyb_t = cost_model.cp_attention_time("hybrid", u=4, r=2, **kw)
    assert ring_t["compute"] == uly_t["compute"] == hyb_t["compute"]
    assert uly_t["exposed"] == uly_t["comm"] > 0 and ring_t["exposed"] <= ring_t["comm"]
    with pytest.raises(ValueError, match="scheme='tree' is unknown"):
        cost_model.cp_attention_time("tree", **kw)


def _on_four_ranks() -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.comm_log import comm_log
    from distlab.context_parallel.layouts import shard
    from distlab.context_parallel.ring import ring_attention
    from distlab.mesh import grid

    rank = dist.get_rank()
    three = dist.new_group([0, 1, 2])
    pairs = grid(dp=2, cp=2)["cp"].get_group()
    hybrid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ring", "ulysses"))
    out: dict = {"verdicts": []}
    for layout in ("zigzag", "contiguous"):  # multi-head on one layout, grouped-query on the other
        runs = [(None, 4, 4), (pairs, 2, 2)] if layout == "zigzag" else [(None, 8, 4), (pairs, 6, 2)]
        runs += [((three, 3, 3) if layout == "zigzag" else (three, 6, 3))] if rank < 3 else []
        for group, heads, kv in runs:
            out["verdicts"].append(ulysses_parity(layout, heads=heads, kv_heads=kv, seq_len=24,
                                                  group=group))
        out["verdicts"].append(ulysses_parity(layout, heads=4, kv_heads=2, seq_len=16,
                                              group=hybrid["ulysses"].get_group(),
                                              ring_group=hybrid["ring"].get_group()))
    # Ulysses beside the ring on the same shards: outputs and gradients, and the bytes each sends
    g = torch.Generator().manual_seed(5)
    full = [torch.randn(1, 4, 32, 8, generator=g, dtype=torch.float64) for _ in range(4)]
    results, sent = {}, {}
    for name, fn in (("ring", ring_attention), ("ulysses", ulysses_attention)):
        local = [shard(t, rank, 4, "zigzag").requires_grad_() for t in full[:3]]
        with comm_log() as log:
            y = fn(*local)
            y.backward(shard(full[3], rank, 4, "zigzag"))
        results[name] = {"output": y, "dq": local[0].grad, "dk": local[1].grad, "dv": local[2].grad}
        ops = ("send",) if name == "ring" else ("all_to_all",)
        sent[name] = {ph: log.sent_bytes(op=ops, phase=ph) for ph in ("forward", "backward")}
    from distlab.parity import compare

    out["against_ring"] = compare(results["ulysses"], results["ring"], dtype=torch.float64)
    out["sent"] = sent
    try:
        ulysses_attention(*(torch.zeros(1, 6, 4, 8) for _ in range(3)))
    except ValueError as err:
        out["error"] = str(err)
    return out


def test_ulysses_on_ranks() -> None:
    results = launch.run(_on_four_ranks, 4)
    for rank, res in enumerate(results):
        assert len(res["verdicts"]) == (8 if rank < 3 else 6)
        for report in res["verdicts"]:
            report.assert_passed()
        res["against_ring"].assert_passed()
        uly = cost_model.ulysses_bytes_per_rank(4, 32, 1, 4, 4, 8, 8)
        assert res["sent"]["ulysses"] == uly
        assert res["sent"]["ring"] == cost_model.bytes_per_rank(4, 32, 1, 4, 8, 8)
        assert "heads=6 is not divisible by the Ulysses group's size p=4" in res["error"]


def test_dense_reference_is_sdpa() -> None:
    """The reference: SDPA with GQA equals SDPA on key/value heads repeated, the definition of GQA."""
    q, k = torch.randn(1, 6, 5, 4, dtype=torch.float64), torch.randn(1, 2, 5, 4, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), k.repeat_interleave(3, 1),
                                          is_causal=True)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True), want)
