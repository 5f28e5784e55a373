"""Which parameters got a gradient, agreed over the group; different sets on different ranks are an error.

ZeRO stages 2 and 3 reduce-scatter a bucket's gradient from a hook, as soon as every parameter in it has
one (Rajbhandari et al. 2020, sec. 5.2). If a rank skips a parameter that another rank uses (a branch
taken on one rank only), its bucket never fills there, so the ranks issue their collectives in different
orders: a hang, or worse, two different buckets summed into each other. DDP has the same hazard (Li et al.
2020, PyTorch Distributed; its `find_unused_parameters`). One all-reduce of a bitmask per parameter, bit r
set when group-rank r computed its gradient, tells every rank who used what: 0 is "no rank" (torch.optim
skips the parameter), all n bits is "every rank", anything between raises the same error on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from distlab.comm_log import where

CONTROL = "zero_control"  # the comm_log label of ZeRO's control messages: not the paper's volume
MASK_RANKS = 62  # up to this many ranks, one int64 says who used a parameter; above it, only whether all did


def _ranks(mask: int, n: int) -> str:
    ranks = [r for r in range(n) if mask >> r & 1]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def agree_on_usage(used: Sequence[bool], names: Sequence[str], group: dist.ProcessGroup | None,
                   device: torch.device | None = None, who: str = "ZeRO") -> list[bool]:
    """All-reduce which parameters got a gradient (a collective, labelled CONTROL); return, per parameter,
    whether any rank computed it. Raise a RuntimeError on every rank, naming the parameters, the ranks that
    used them and the fix, where some ranks computed a gradient and others did not."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    flags, op = _usage_flags(used, n, rank, device)
    with where(CONTROL):
        dist.all_reduce(flags, op=op, group=group)
    if flags.is_meta:  # a dry run: no values come back
        return list(map(bool, used))
    uneven, anywhere = _read_flags(flags.tolist(), names, n, len(used))
    _check_even(uneven, n, who)
    return anywhere


def _usage_flags(used: Sequence[bool], n: int, rank: int,
                 device: torch.device | None) -> tuple[torch.Tensor, dist.ReduceOp]:
    """This rank's flags and the reduction that combines them: bit `rank` per parameter (up to
    MASK_RANKS ranks), else (u, -u) under max."""
    if n <= MASK_RANKS:
        flags = torch.tensor([int(u) << rank for u in used], dtype=torch.int64, device=device)
        op = dist.ReduceOp.SUM  # distinct bits: the sum is the bitwise or
    else:  # max of (u, -u): whether any rank used it, and whether every rank did
        flags = torch.tensor([int(u) for u in used] + [-int(u) for u in used], dtype=torch.int64,
                             device=device)
        op = dist.ReduceOp.MAX
    return flags, op


def _read_flags(got: list[int], names: Sequence[str], n: int,
                k: int) -> tuple[list[tuple[str, str]], list[bool]]:
    """From the reduced flags of k parameters: those some ranks used and others did not (name, which
    ranks), and per parameter whether any rank used it."""
    if n <= MASK_RANKS:
        everyone = (1 << n) - 1
        uneven = [(name, _ranks(m, n)) for name, m in zip(names, got, strict=True) if 0 < m < everyone]
        anywhere = [m > 0 for m in got]
    else:
        uneven = [(name, "some ranks") for name, a, b in zip(names, got[:k], got[k:], strict=True)
                  if a == 1 and b == 0]
        anywhere = [a > 0 for a in got[:k]]
    return uneven, anywhere


def _check_even(uneven: list[tuple[str, str]], n: int, who: str) -> None:
    """No parameter got a gradient on some ranks only; else the same RuntimeError on every rank."""
    if uneven:
        listed = "; ".join(f"{name} (gradient on {ranks} only)" for name, ranks in uneven[:10])
        more = f" and {len(uneven) - 10} more" if len(uneven) > 10 else ""
        raise RuntimeError(
            f"{who}: {len(uneven)} parameter(s) got a gradient on some ranks of the group of {n} but not "
            f"on others: {listed}{more}. In stages 2 and 3 the ranks would reduce different buckets in "
            "different orders (a hang or a wrong average), so every stage refuses it. Use every parameter "
            "in every rank's loss, or multiply the unused output by zero (loss = loss + 0 * "
            "branch(x).sum()) so that every rank computes its gradient")
