"""The check of the lab's ZeRO-2 exercise: the gradient reduce-scatter step.

The student writes `fn(flat_grad, group) -> Tensor`: given this rank's flat gradient (numel values, the
same length on every rank) and the data-parallel group of N ranks, return this rank's shard of the
gradient averaged over the group: pad to a multiple of N, reduce-scatter, divide by N (Rajbhandari et al.
2020, sec. 5.2). Shard i (of ceil(numel / N) values) belongs to group-rank i.

`check_zero2_hook(fn)` starts 4 ranks once and runs `fn` in every case at the same time, on groups that
are not the first ranks of the world, so that a global rank used in place of the group rank shows: N = 1
on {0} beside N = 3 on {1, 2, 3}, then N = 2 on {0, 1} and on {2, 3}, then N = 4. With 10 values, N = 3
and N = 4 need padding. Each case says what is wrong: not averaged, the wrong shard, no padding, no
communication, or an all-reduce where a reduce-scatter does (right values, twice the traffic: the calls
are seen by `distlab.comm_log`, however the student makes them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from distlab import launch
from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult, is_stub
from distlab.comm_log import comm_log
from distlab.dist_compat import reduce_scatter_single

NUMEL = 10
PHASES = ([[0], [1, 2, 3]], [[0, 1], [2, 3]], [[0, 1, 2, 3]])  # groups run at the same time, per phase


def zero2_reduce_scatter(flat_grad: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """The reference: this rank's shard of `flat_grad` averaged over `group` (padded, reduce-scattered)."""
    n = dist.get_world_size(group)
    shard = math.ceil(flat_grad.numel() / n)
    padded = torch.zeros(shard * n, dtype=flat_grad.dtype, device=flat_grad.device)
    padded[:flat_grad.numel()] = flat_grad
    out = torch.empty(shard, dtype=flat_grad.dtype, device=flat_grad.device)
    reduce_scatter_single(out, padded, group=group)
    return out / n


def _gradient(group_rank: int, device: torch.device | str = "cpu") -> Tensor:
    """Group-rank g's gradient on `device`: distinct on every rank and at every position, exact in fp32."""
    return torch.arange(NUMEL, dtype=torch.float32, device=device) * (group_rank + 1) + 0.5 * group_rank


def _expected(n: int) -> tuple[Tensor, Tensor]:
    """The average over n ranks, padded to a multiple of n, and its shards as rows (n, shard)."""
    total = sum(_gradient(g) for g in range(n)) / n
    shard = math.ceil(NUMEL / n)
    padded = torch.zeros(shard * n, device="cpu")  # the expected values, compared on the CPU
    padded[:NUMEL] = total
    return padded, padded.view(n, shard)


def _shape_problem(out: Tensor, n: int, r: int) -> list[str]:
    shard = math.ceil(NUMEL / n)
    if out.numel() == shard:
        return []
    if out.numel() in (NUMEL, shard * n):
        return [f"returned {out.numel()} values, the whole gradient: return only this rank's shard of "
                f"{shard} (reduce-scatter, then keep shard {r})"]
    if out.numel() == NUMEL // n:
        return [f"returned {out.numel()} values but the shard has {shard}: {NUMEL} is not divisible by "
                f"N={n}, so pad the gradient with zeros to {shard * n} before reduce-scattering"]
    hint = "" if dist.get_rank() == r else " (was it cut with the global rank? use dist.get_rank(group))"
    return [f"returned {out.numel()} values; the shard of group-rank {r} has ceil({NUMEL}/{n}) = {shard}"
            + hint]


def _value_problem(out: Tensor, n: int, r: int) -> list[str]:
    _, shards = _expected(n)
    if torch.equal(out, shards[r]):
        return []
    if torch.equal(out, shards[r] * n):
        return [f"the shard is the sum over the {n} ranks, not the average: divide by the group size N={n}"]
    global_rank = dist.get_rank()
    for j in range(n):
        if torch.equal(out, shards[j]):
            hint = " (the global rank: use dist.get_rank(group))" if j == global_rank % n else ""
            return [f"group-rank {r} returned shard {j}{hint}; rank i of the group owns shard i"]
    mine = torch.zeros(shards.numel(), device="cpu")
    mine[:NUMEL] = _gradient(r)
    if torch.equal(out, mine.view(n, -1)[r]) or torch.equal(out, mine.view(n, -1)[r] / n):
        return ["the values are this rank's own gradient: reduce over the group before keeping the shard"]
    return [f"group-rank {r} got the wrong values: expected {shards[r].tolist()}, got {out.tolist()}"]


def _run_case(fn: Callable[[Tensor, dist.ProcessGroup | None], Tensor], group: dist.ProcessGroup,
              n: int) -> list[str]:
    """Inside a rank of `group`: call fn, count its all-reduces, and explain what is wrong ([] = right)."""
    r = dist.get_rank(group)
    with comm_log() as log:  # sees every collective fn calls, however it calls it
        try:
            out = fn(_gradient(r, launch.device()), group)  # on the rank's device: its GPU under NCCL
        except Exception as e:  # the student's error, reported as a line of the check
            return [NOT_WRITTEN if is_stub(e) else f"raised {type(e).__name__}: {e}"]
    if not isinstance(out, Tensor):
        return [f"returned {type(out).__name__}, not a Tensor"]
    out = out.detach().reshape(-1).float().cpu()
    lines = _shape_problem(out, n, r) or _value_problem(out, n, r)
    if not lines and log.calls(op="all_reduce") and n > 1:
        lines = ["the values are right, but an all-reduce sends 2 (N-1)/N of the gradient per rank where a "
                 "reduce-scatter sends (N-1)/N: use dist.reduce_scatter_single (reduce_scatter_tensor)"]
    return lines


def _all_cases(fns: list[Callable[[Tensor, dist.ProcessGroup | None], Tensor]],
               phases: Sequence[Sequence[list[int]]] = PHASES) -> list[dict[str, list[str]]]:
    """Inside each of 4 ranks: every phase's groups, in one order on every rank (new_group is collective
    over the world); for each fn, {case label: this rank's lines} for the cases this rank took part in."""
    me = dist.get_rank()
    groups = [[(ranks, dist.new_group(ranks)) for ranks in phase] for phase in phases]
    out: list[dict[str, list[str]]] = [{} for _ in fns]
    for k, fn in enumerate(fns):
        for phase in groups:
            for ranks, group in phase:
                if me in ranks:
                    label = f"N={len(ranks)} on global ranks {{{','.join(map(str, ranks))}}}"
                    out[k][label] = _run_case(fn, group, len(ranks))
            dist.barrier()
    return out


def _report(per_rank: list[dict[str, list[str]]]) -> CheckResult:
    labels = sorted({label for rank in per_rank for label in rank})
    cases = []
    for label in labels:
        lines = list(dict.fromkeys(line for rank in per_rank for line in rank.get(label, [])))
        cases.append(CaseResult(label, not lines, lines))
    return CheckResult("ZeRO-2 gradient reduce-scatter", cases, case_heading="group")


def check_zero2_hooks(fns: list[Callable[[Tensor, dist.ProcessGroup | None], Tensor]],
                      timeout: float = 30.0, phases: Sequence[Sequence[list[int]]] = PHASES
                      ) -> list[CheckResult]:
    """`check_zero2_hook` for several attempts at once, in one start of the ranks."""
    try:
        per_rank = launch.run(_all_cases, 4, list(fns), phases, timeout=timeout)
    except launch.RankError as e:
        if is_stub(e):
            stub = CaseResult("4 ranks", False, [NOT_WRITTEN])
            return [CheckResult("ZeRO-2 gradient reduce-scatter", [stub], case_heading="group") for _ in fns]
        failed = CheckResult("ZeRO-2 gradient reduce-scatter", [CaseResult("4 ranks", False, [
            "a rank failed or was stuck in a collective: call every collective with group=group (the ranks "
            f"of this case), not the default group ({str(e).splitlines()[0]})"])], case_heading="group")
        return [failed for _ in fns]
    return [_report([rank[k] for rank in per_rank]) for k in range(len(fns))]


def check_zero2_hook(fn: Callable[[Tensor, dist.ProcessGroup | None], Tensor],
                     timeout: float = 30.0, phases: Sequence[Sequence[list[int]]] = PHASES) -> CheckResult:
    """Run the student's ZeRO-2 gradient step on groups of 1-4 ranks and explain what is wrong. `phases`:
    the groups (global ranks of 4) that run at the same time, phase after phase (default `PHASES`)."""
    return check_zero2_hooks([fn], timeout, phases)[0]
