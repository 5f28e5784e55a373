"""The check of chapter 2's exercise: a bucketed gradient all-reduce, and what is wrong with yours.

The student writes `fn(bucket)`: given a list of parameters whose `.grad` hold this rank's gradients,
average those gradients over all ranks with *one* all-reduce: flatten them into one buffer, all-reduce
it, divide by the world size, copy each slice back into its `p.grad` (Li et al. 2020, sec. 3.2;
`sync.all_reduce_bucket` is the worked version).

`check_bucketed_all_reduce(fn)` runs it on real ranks, on five parameters of different shapes cut into
buckets by `sync.make_buckets`, and compares every gradient with the true average. The gradients are
built so that mistakes leave fingerprints: every value is distinct (so a value in the wrong place shows
where it came from) and every rank's values differ (so "only rank 0's gradient" is recognisable). When
the result is wrong, `explain` names the mistake: not divided by p, divided twice, never copied back,
rank 0's gradient everywhere (a broadcast), the result only on rank 0 (a reduce), right values in the
wrong places (copy-back order or offsets), or some parameters of the bucket left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult, is_stub, not_written
from distlab.data_parallel.sync import make_buckets

SHAPES: tuple[tuple[int, ...], ...] = ((3, 4), (5,), (2, 3), (4,), (2, 2))
BUCKET_BYTES = 48  # 12 floats: buckets [(2, 2) (4,)], [(2, 3) (5,)], [(3, 4)] in backward order


def make_params(rank: int, device: torch.device | str = "cpu") -> list[nn.Parameter]:
    """Parameters of SHAPES on `device` whose gradient on `rank` is 1000 (rank + 1) + 10 j + i / 10 for
    element i of parameter j: every value distinct within a rank, and different on every rank."""
    params = []
    for j, shape in enumerate(SHAPES):
        p = nn.Parameter(torch.zeros(shape, device=device))
        values = 1000.0 * (rank + 1) + 10.0 * j + torch.arange(p.numel(), dtype=torch.float32,
                                                                device=device) / 10
        p.grad = values.view(shape)
        params.append(p)
    return params


def _close(a: Tensor, b: Tensor) -> bool:
    """Equal up to float32 rounding: the values are below 5000, so 1e-4 absolute is many ulps."""
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-4)


def explain(results: Sequence[Tensor], before: Sequence[Tensor], sizes: Sequence[int]) -> list[str]:
    """What is wrong with one bucket, as sentences ([] if it is right).

    results[r]: rank r's gradients of the bucket after `fn`, flattened in bucket order; before[r]: the
    same before `fn`; sizes: the number of elements of each parameter of the bucket.
    """
    p = len(results)
    want = torch.stack(list(before)).mean(0)
    wrong = [r for r in range(p) if not _close(results[r], want)]
    if not wrong:
        return []

    story = _whole_bucket_mistake(results, before, want)
    if story:
        return [story]
    if p > 1 and 0 not in wrong:
        return [f"rank 0 holds the right average but ranks {wrong} do not: dist.reduce delivers the sum to "
                "its destination rank only; dist.all_reduce delivers it to every rank"]
    return _placement_mistake(results, want, wrong, sizes)


def _whole_bucket_mistake(results: Sequence[Tensor], before: Sequence[Tensor], want: Tensor) -> str | None:
    """The mistake that explains every rank's whole bucket at once (sums, no copy back, no all-reduce,
    a broadcast), tried in order; None if none does."""
    p = len(results)
    broadcast = ("every rank ends with rank 0's gradient: the other ranks' gradients were never added. "
                 "dist.broadcast copies rank 0's buffer; dist.all_reduce sums over all ranks")
    stories: list[tuple[bool, Callable[[int], Tensor], str]] = [
        (p > 1, lambda r: before[r],
         "p.grad is unchanged on every rank: the averaged values never reached the gradients. torch.cat "
         "makes a new tensor, so after the all-reduce copy each slice of the flat buffer back into its "
         "p.grad (p.grad.copy_(flat[offset:offset + n].view_as(p.grad)))"),
        (True, lambda r: want * p,
         f"these are the sums, not the averages: divide the flat buffer by the world size ({p}) after the "
         "all-reduce"),
        (p > 1, lambda r: want / p,
         f"the values are the average divided by {p} once more: divide by the world size only once"),
        (p > 1, lambda r: before[r] / p,
         f"each rank holds its own gradient divided by {p}: the all-reduce is missing; call "
         "dist.all_reduce(flat) before dividing"),
        (p > 1, lambda r: before[0], broadcast),
        (p > 1, lambda r: before[0] / p, broadcast),
    ]
    for applies, expected, story in stories:
        if applies and all(_close(results[r], expected(r)) for r in range(p)):
            return story
    return None


def _placement_mistake(results: Sequence[Tensor], want: Tensor, wrong: list[int],
                       sizes: Sequence[int]) -> list[str]:
    """What is wrong when the values are not a whole-bucket mistake (sums, broadcast, reduce...): the
    right values in the wrong places, or some parameters of the bucket left out."""
    if all(_close(results[r].sort().values, want.sort().values) for r in wrong):
        return ["the right values are in the wrong places: copy the slices back in the same order as you "
                "flattened the gradients, and advance the offset by each parameter's numel()"]
    bad_params, start = [], 0
    for j, n in enumerate(sizes):
        if not _close(results[wrong[0]][start:start + n], want[start:start + n]):
            bad_params.append(j)
        start += n
    if 0 < len(bad_params) < len(sizes):
        return [f"parameters {bad_params} of the bucket's {len(sizes)} are wrong while the others are "
                "right: flatten every parameter of the bucket, and copy a slice back into each of them"]
    return [f"ranks {wrong} hold wrong values in a way the check does not recognise (largest error "
            f"{(results[wrong[0]] - want).abs().max().item():.3g})"]


def run_in_rank(fn: Callable[[list[nn.Parameter]], Any]) -> list[str]:
    """Inside a rank: call `fn` on each bucket of `make_params(rank)`, gather every rank's gradients
    before and after, and explain what is wrong (every rank returns the same sentences)."""
    from distlab import launch

    rank, p = dist.get_rank(), dist.get_world_size()
    problems = []

    def gathered(bucket: list[nn.Parameter]) -> list[Tensor]:  # every rank's gradients, on the CPU
        mine = torch.cat([q.grad.reshape(-1) for q in bucket])
        out = [torch.empty_like(mine) for _ in range(p)]
        dist.all_gather(out, mine)
        return [t.cpu() for t in out]

    # the parameters on the rank's device (its GPU under NCCL); the explanation compares on the CPU
    for b, bucket in enumerate(make_buckets(make_params(rank, launch.device()), BUCKET_BYTES)):
        before = gathered(bucket)
        returned = fn(bucket)
        if returned is not None and b == 0:
            problems.append(f"fn returned a {type(returned).__name__}; it should change p.grad in place "
                            "and return None")
        after = gathered(bucket)
        shapes = ", ".join(str(tuple(q.shape)) for q in bucket)
        problems += [f"bucket {b} [{shapes}]: {line}"
                     for line in explain(after, before, [q.numel() for q in bucket])]
    return problems


def _merge(lines: list[str]) -> list[str]:
    """Say a problem once, naming every bucket that has it: "buckets 0, 2: <problem>"."""
    where: dict[str, list[str]] = {}
    for line in lines:
        head, _, problem = line.partition(": ")
        if head.startswith("bucket "):
            where.setdefault(problem, []).append(head.split(" [")[0].removeprefix("bucket "))
        else:
            where.setdefault(line, [])
    return [f"bucket{'s' if len(b) > 1 else ''} {', '.join(b)}: {p}" if b else p for p, b in where.items()]


def _check_arguments(fn: Any, world_sizes: Sequence[int]) -> None:
    """Raise a clear error for a check called with something else than a function or bad world sizes."""
    if not callable(fn):
        raise ValueError(f"fn={fn!r} is not a function: pass your function itself, e.g. "
                         "check_bucketed_all_reduce(my_bucket_all_reduce), without calling it")
    if any(isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 8 for p in world_sizes):
        raise ValueError(f"world_sizes={tuple(world_sizes)} must hold whole numbers from 1 to 8, "
                         "e.g. (2, 3)")


def _world_case(fn: Callable[[list[nn.Parameter]], Any], p: int, label: str, timeout: float) -> CaseResult:
    """One world size: `fn` run on p ranks, its verdict (a stub, a hang, a raise, or what the ranks saw)."""
    from distlab import launch

    try:
        per_rank = launch.run(run_in_rank, p, fn, timeout=timeout)
    except launch.RankError as err:
        last = (err.traceback or str(err)).strip().splitlines()[-1]
        hang = "timed out" in str(err).lower()
        if is_stub(err):
            return not_written(label)
        return CaseResult(label, False, [
            f"rank {err.rank} waited for the other ranks and timed out: every rank must make the same "
            "collective calls in the same order" if hang else f"rank {err.rank} raised: {last}"])
    return CaseResult(label, not per_rank[0], _merge(per_rank[0]))  # every rank says the same


def check_bucketed_all_reduce(fn: Callable[[list[nn.Parameter]], Any], world_sizes: Sequence[int] = (2, 3),
                              timeout: float = 10.0) -> CheckResult:
    """Run `fn(bucket)` on each world size and report, per world size, what is wrong (see the module
    docstring). `timeout`: seconds a rank may wait in a collective before the check calls it a hang."""
    _check_arguments(fn, world_sizes)
    cases: list[CaseResult] = []
    for p in world_sizes:
        label = f"{p} rank{'s' if p > 1 else ''}"
        if cases and cases[-1].lines == [NOT_WRITTEN]:  # still the stub: the next launch would say the same
            cases.append(not_written(label))
        else:
            cases.append(_world_case(fn, p, label, timeout))
    return CheckResult("check_bucketed_all_reduce", cases)
