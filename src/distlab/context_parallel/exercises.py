"""Checks of the lab's exercises, each returning a `distlab.checks.CheckResult`.

1. `check_merge(fn)`: the online-softmax merge of two partial attention results, (out, lse) pairs
   (Milakov & Gimelshein 2018; Dao et al. 2022, sec. 3.1), against softmax attention over the
   concatenated keys.
2. `check_zigzag_chunks(fn)`: which chunks rank r of p holds under the zig-zag layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult, is_stub, not_written
from distlab.context_parallel.layouts import chunk_ids
from distlab.context_parallel.merge import block_attention

MergeFn = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def _merge_case(fn: MergeFn, label: str, scale: float, masked_b: bool, seed: int = 7) -> CaseResult:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    q = q * scale
    ka, kb, va, vb = k[:, :2], k[:, 2:], v[:, :2], v[:, 2:]
    want, want_lse = block_attention(q, k, v)
    out_a, lse_a = block_attention(q, ka, va)
    out_b, lse_b = block_attention(q, kb, vb)
    if masked_b:  # block b entirely masked for these queries: nothing seen, lse = -inf, output 0
        want, want_lse = out_a, lse_a
        out_b, lse_b = torch.zeros_like(out_b), torch.full_like(lse_b, float("-inf"))
    try:
        got, got_lse = fn(out_a, lse_a, out_b, lse_b)
    except Exception as e:  # the check reports the student's error instead of raising it
        if is_stub(e):
            return not_written(label)
        return CaseResult(label, False, [f"raised {type(e).__name__}: {e}"])
    lines = []
    if not torch.isfinite(got).all():
        lines.append("the output has inf or nan: subtract the larger lse (the running max) before exp, and "
                     "treat an lse of -inf (a block with no visible key) as weight 0")
    elif not torch.allclose(got, want, atol=1e-10, rtol=0):
        lines.append("the output differs from softmax over all keys: weight each partial output by "
                     "exp(lse_part - lse_total), which rescales it to the common denominator")
    if not torch.allclose(got_lse, want_lse, atol=1e-10, rtol=0):
        lines.append("the log-sum-exp differs: lse_total = log(exp(lse_a) + exp(lse_b)), computed as "
                     "m + log(exp(lse_a - m) + exp(lse_b - m)) with m = max(lse_a, lse_b)")
    return CaseResult(label, not lines, lines)


def check_merge(fn: MergeFn, seed: int = 7) -> CheckResult:
    """`fn(out_a, lse_a, out_b, lse_b) -> (out, lse)` against attention over the concatenated blocks
    (queries, keys and values drawn from `seed`)."""
    cases = [_merge_case(fn, "two blocks of ordinary scores", 1.0, False, seed),
             _merge_case(fn, "large scores (exp would overflow without the max)", 400.0, False, seed),
             _merge_case(fn, "second block entirely masked (lse = -inf)", 1.0, True, seed)]
    return CheckResult("merge two partial attention results", cases, case_heading="case")


def check_zigzag_chunks(fn: Callable[[int, int], tuple[int, ...]],
                        world_sizes: Sequence[int] = (1, 2, 3, 4)) -> CheckResult:
    """`fn(rank, p) -> chunk numbers` against the zig-zag layout for each p of `world_sizes` (1 .. 4)."""
    cases = []
    for p in world_sizes:
        lines = []
        for r in range(p):
            want = chunk_ids(r, p, "zigzag")
            try:
                got = tuple(sorted(int(i) for i in fn(r, p)))
            except Exception as e:  # reported, not raised
                if is_stub(e):
                    lines = [NOT_WRITTEN]
                    break
                lines.append(f"rank {r}: raised {type(e).__name__}: {e}")
                continue
            if got != want:
                lines.append(f"rank {r}: got chunks {got}, expected {want}: the sequence has 2p = {2 * p} "
                             f"chunks; rank r takes chunk r from the front and chunk 2p-1-r from the back")
        cases.append(CaseResult(f"p = {p}", not lines, lines))
    return CheckResult("zig-zag chunks per rank", cases)
