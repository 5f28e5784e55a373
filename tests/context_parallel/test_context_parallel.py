"""Chapter 10 without ranks: the merge, the layouts, the cost model, single-process parity (a group of
one), the memory measurement, the exercises and the command line. The ranks are in
test_context_parallel_ranks.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distlab.context_parallel import cost_model
from distlab.context_parallel.__main__ import main
from distlab.context_parallel.exercises import check_merge, check_zigzag_chunks
from distlab.context_parallel.layouts import (
    block_kind,
    check_seq_len,
    chunk_ids,
    pad_to_multiple,
    positions,
    shard,
    unshard,
)
from distlab.context_parallel.merge import block_attention, merge
from distlab.context_parallel.parity import attention_parity, gpt_parity
from distlab.context_parallel.ring import ring_attention
from distlab.context_parallel.saved_activations import measured_dense_bytes, measured_ring_bytes

TOL = 1e-12  # float64: the block-wise sums add the same terms in another order


def _qkv(*shape: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("split", [1, 3, 6])
def test_merge_equals_softmax_over_the_concatenation(split: int) -> None:
    q, k, v = _qkv(2, 3, 5, 4)
    out_a, lse_a = block_attention(q, k[..., :split, :], v[..., :split, :])
    out_b, lse_b = block_attention(q, k[..., split:, :], v[..., split:, :]) if split < 5 else (
        torch.zeros_like(out_a), torch.full_like(lse_a, float("-inf")))
    out, lse = merge(out_a, lse_a, out_b, lse_b)
    scores = q @ k.transpose(-2, -1) / 2.0
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=TOL, rtol=0)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=TOL, rtol=0)


def test_merge_is_stable_and_handles_rows_with_no_key() -> None:
    q, k, v = _qkv(4, 6)
    out_a, lse_a = block_attention(q * 500, k[:2], v[:2])
    out_b, lse_b = block_attention(q * 500, k[2:], v[2:])
    out, _ = merge(out_a, lse_a, out_b, lse_b)
    assert torch.isfinite(out).all()
    empty = torch.full_like(lse_a, float("-inf"))
    out, lse = merge(torch.zeros_like(out_a), empty, torch.zeros_like(out_a), empty)
    assert (out == 0).all() and torch.isneginf(lse).all()
    with pytest.raises(ValueError, match=r"merge needs outputs of one shape \(got \(4, 6\) and \(3, 6\)\)"):
        merge(out_a, lse_a, out_a[:3], lse_a[:3])


def test_layouts_chunks_shard_unshard_positions() -> None:
    assert [chunk_ids(r, 4, "zigzag") for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [chunk_ids(r, 3, "contiguous") for r in range(3)] == [(0,), (1,), (2,)]
    assert positions(1, 2, 8, "zigzag").tolist() == [2, 3, 4, 5]
    x = torch.arange(2 * 24).view(2, 24, 1)
    for layout in ("zigzag", "contiguous"):
        for p in (1, 2, 3, 4):
            pieces = [shard(x, r, p, layout, dim=1) for r in range(p)]
            assert torch.equal(unshard(pieces, layout, dim=1), x)
            for r in range(p):
                assert torch.equal(pieces[r][0, :, 0], positions(r, p, 24, layout))
    assert [block_kind(2, b) for b in (1, 2, 3)] == ["full", "diagonal", "skip"]
    assert pad_to_multiple(torch.ones(1, 7, 2), 2, "zigzag").shape == (1, 8, 2)


def test_uneven_lengths_are_rejected_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"seq_len=10 is not a positive multiple of 4 \(zigzag layout on "
                                         r"p=2 ranks.*pad the sequence at its end to 12 tokens"):
        check_seq_len(10, 2, "zigzag")
    with pytest.raises(ValueError, match=r"seq_len=2 is not a positive multiple of 3.*to 3 tokens"):
        check_seq_len(2, 3, "contiguous")
    with pytest.raises(ValueError, match=r"layout='striped' is unknown; choose one of contiguous, zigzag"):
        chunk_ids(0, 2, "striped")
    q, k, v = _qkv(1, 5, 4)
    with pytest.raises(ValueError, match=r"seq_len=5 is not a positive multiple of 2"):
        ring_attention(q, k, v)
    with pytest.raises(ValueError, match=r"q, k and v must have one shape"):
        ring_attention(q, k[:, :4], v)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_cost_model_against_brute_force(p: int) -> None:
    for layout in ("contiguous", "zigzag"):
        brute = [sum(block_kind(a, b) != "skip" for a in chunk_ids(r, p, layout)
                     for s in range(p) for b in chunk_ids(s, p, layout)) for r in range(p)]
        assert brute == cost_model.blocks_per_rank(p, layout)
        schedule = cost_model.ring_schedule(p, layout)
        assert [sum(row[r][1] for row in schedule) for r in range(p)] == brute
    assert cost_model.imbalance(p, "contiguous") == pytest.approx(2 * p / (p + 1))
    assert cost_model.imbalance(p, "zigzag") == 1.0
    # score entries: every (i, j <= i) pair once, plus the masked half of the diagonal blocks
    L = 8 * p
    for layout, n in (("contiguous", p), ("zigzag", 2 * p)):
        assert sum(cost_model.score_entries_per_rank(p, L, layout)) == L * (L + 1) / 2 + n * (L / n) * (
            L / n - 1) / 2


def test_single_process_parity_both_layouts_padding_and_gpt() -> None:
    for layout in ("zigzag", "contiguous"):
        rep = attention_parity(layout, seq_len=24)
        assert max(rep.max_error.values()) <= TOL, rep
        assert rep.bytes_forward == rep.bytes_backward == 0
        assert rep.blocks["full"] + rep.blocks["diagonal"] == cost_model.blocks_per_rank(1, layout)[0]
    assert max(attention_parity("zigzag", seq_len=23, pad=True).max_error.values()) <= TOL
    got = gpt_parity("zigzag", seq_len=16)
    assert got.worst() <= TOL and len(got.differences["gradients"]) == 28


def test_memory_measured_against_formula_and_estimator() -> None:
    assert measured_ring_bytes(16, 1, 2, 8) == cost_model.attention_saved_bytes(1, 16, 1, 2, 8, 8)
    assert measured_dense_bytes(24, 2, 3, 4) == cost_model.dense_attention_saved_bytes(24, 2, 3, 4, 8)
    # the estimator keeps the log-sum-exp in fp32 (4 bytes) where this float64 run keeps 8
    assert cost_model.estimator_attention_bytes(4, 64, 1, 2, 8, 8) == cost_model.attention_saved_bytes(
        4, 64, 1, 2, 8, 8, lse_bytes=4)


def test_exercises_pass_the_solution_and_explain_mistakes() -> None:
    assert check_merge(merge)

    def no_max(oa, la, ob, lb):
        lse = torch.log(torch.exp(la) + torch.exp(lb))
        return torch.exp(la - lse)[..., None] * oa + torch.exp(lb - lse)[..., None] * ob, lse

    report = check_merge(no_max)
    assert not report and "m = max(lse_a, lse_b)" in str(report)
    assert check_zigzag_chunks(lambda r, p: (r, 2 * p - 1 - r))
    wrong = check_zigzag_chunks(lambda r, p: (2 * r, 2 * r + 1))
    assert not wrong and "rank 0: got chunks (0, 1), expected (0, 3)" in str(wrong)


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    summary = main(["--world-size", "1", "--seq-len", "7", "--pad"])
    assert summary["passed"]
    assert "agree with dense causal attention within 1e-10: ok" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--world-size", "2", "--seq-len", "10", "--layout", "zigzag"])
    assert e.value.code == 2
    assert "argument --seq-len: seq_len=10 is not a positive multiple of 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--world-size", "0"])
    assert "argument --world-size: 0 must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "(default: 24)" in capsys.readouterr().out


def test_dense_reference_is_the_builtin() -> None:
    q, k, v = _qkv(1, 2, 8, 4)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(block_attention(q, k, v, causal=True)[0], ref, atol=TOL, rtol=0)
