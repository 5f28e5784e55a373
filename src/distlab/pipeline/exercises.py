"""The checks of chapter 4's exercises: write the 1F1B compute order, or one rank's ZB-H1 order, and find
out what is wrong with it (`check_zb_h1_rank`, at the end of this file, runs on paper and in the
simulator only).

The student writes `fn(p, m)`, returning for each rank r the list of its forward and backward passes in
order, as ("F", i) / ("B", i) pairs (or `Action`s). `check_one_f_one_b(fn)` returns a
`distlab.checks.CheckResult` with one case per (p, m) and one per real run:
1. on paper, for many (p, m), including m < p: every microbatch has one F and one B, each B after its F;
   the order cannot deadlock (and if it does, which ranks wait for what); the warm-up of each rank is
   min(p - r - 1, m) forwards, and the peak stash at most p - r;
2. simulated with t_b = 2 t_f, the bubble equals (p - 1) / (m + p - 1);
3. on real ranks (one launch for p = 4 with several m), through the executor, the step equals
   single-process training (`parity.step_parity`). This runs only when every paper case passed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult
from distlab.pipeline.actions import Action
from distlab.pipeline.communication import DeadlockError, add_communication, check_compute_order
from distlab.pipeline.cost_model import bubble_fraction
from distlab.pipeline.schedules import one_f_one_b_order
from distlab.pipeline.simulate import peak_stash, simulate, timeline_stats

CASES = ((1, 1), (1, 3), (2, 1), (2, 2), (2, 5), (3, 2), (3, 4), (4, 3), (4, 8))  # m < p included
RUN_P, RUN_MS = 4, (2, 5, 8)
EXERCISE = "check_one_f_one_b"


def _as_orders(raw: Any, p: int, m: int) -> list[list[Action]]:
    if not isinstance(raw, Sequence) or len(raw) != p:
        raise ValueError(f"fn({p}, {m}) must return a list with one list per rank ({p} lists), "
                         f"got {raw!r:.80}")
    orders = []
    for r, items in enumerate(raw):
        order = []
        for it in items:
            if isinstance(it, Action):
                order.append(Action(it.op, it.microbatch, r))
            else:
                op, mb = it
                order.append(Action(str(op), int(mb), r))
        orders.append(order)
    return orders


def _structure(orders: list[list[Action]], p: int, m: int) -> str | None:
    """What is wrong with the passes each rank runs (not their order), or None."""
    for r, order in enumerate(orders):
        if any(o.op not in ("F", "B") for o in order):
            return f"rank {r} has ops other than 'F' and 'B'"
        fs = [a.microbatch for a in order if a.op == "F"]
        bs = [a.microbatch for a in order if a.op == "B"]
        if sorted(bs) != list(range(m)):
            missing = sorted(set(range(m)) - set(bs))
            return (f"rank {r} runs backwards {bs}; "
                    + (f"missing backward for microbatch(es) {missing}: their gradients would never reach "
                       "the weights" if missing else "each microbatch needs exactly one B"))
        if sorted(fs) != list(range(m)):
            return f"rank {r} runs forwards {fs}; each microbatch needs exactly one F"
    return None


def _warmup_and_stash(orders: list[list[Action]], p: int, m: int) -> str | None:
    """What is wrong with each rank's warm-up and peak stash, or None."""
    for r, order in enumerate(orders):
        warmup = next((i for i, a in enumerate(order) if a.op == "B"), len(order))
        want = min(p - r, m)
        if warmup > want:
            extra = warmup - want
            return (f"{'one' if extra == 1 else extra} warm-up forward{'s' if extra > 1 else ''} too many: "
                    f"rank {r} runs {warmup} forwards before its first backward; 1F1B runs min(p - r, m) = "
                    f"{want} (a warm-up of min(p - r - 1, m), then the steady state's first F). The "
                    "gradients still come out right, but each extra forward keeps one more micro-batch's "
                    "activations stashed: that memory is what 1F1B saves over GPipe, not 1F1B")
        if warmup < want:
            return (f"rank {r} runs {warmup} forwards before its first backward; 1F1B runs min(p - r, m) = "
                    f"{want}: with fewer, it waits for a gradient that the ranks after it cannot send yet")
        if peak_stash(order) > want:
            return (f"rank {r} holds {peak_stash(order)} microbatches at once; 1F1B holds at most "
                    f"min(p - r, m) = {want}: after the warm-up, alternate one F and one B")
    return None


def _backward_order(orders: list[list[Action]]) -> str | None:
    """1F1B runs each rank's backwards oldest micro-batch first (the order of the forwards), or None."""
    for r, order in enumerate(orders):
        bs = [a.microbatch for a in order if a.op == "B"]
        k = next((k for k in range(1, len(bs)) if bs[k] < bs[k - 1]), None)
        if k is not None:
            return (f"rank {r} runs the backward of micro-batch {bs[k - 1]} before that of micro-batch "
                    f"{bs[k]}: the newest micro-batch's backward first. 1F1B runs the backwards in the order "
                    "of the forwards, oldest first: the older micro-batch's gradient arrives first from the "
                    "next stage, and its stashed activations are the ones to free")
    return None


def _paper_case(fn: Callable[[int, int], Any], p: int, m: int) -> CaseResult:
    """Check fn(p, m) on paper and in the simulator."""
    label = f"p={p}, m={m}"
    try:
        orders = _as_orders(fn(p, m), p, m)
    except NotImplementedError:
        return CaseResult(label, False, [NOT_WRITTEN])
    except (TypeError, ValueError) as e:
        return CaseResult(label, False, [str(e)])
    problem = _structure(orders, p, m) or _backward_order(orders)
    if problem is None:
        try:
            check_compute_order("your 1F1B", orders, p)
        except DeadlockError as e:
            problem = str(e)
    problem = problem or _warmup_and_stash(orders, p, m)
    if problem:
        return CaseResult(label, False, problem.split("\n"))
    sim = timeline_stats(simulate(add_communication("yours", orders, p, m)), p).mean_bubble
    if abs(sim - bubble_fraction(p, m)) > 1e-9:
        return CaseResult(label, False, [f"simulated bubble {sim:.3f}, but 1F1B's is (p-1)/(m+p-1) = "
                                         f"{bubble_fraction(p, m):.3f}; compare your order with "
                                         f"one_f_one_b_order({p}, {m})"])
    note = "" if orders == one_f_one_b_order(p, m) else " (order differs from the reference but is valid)"
    return CaseResult(label, True, [f"no deadlock, warm-up and stash right, bubble {sim:.3f} = "
                                    f"formula{note}"])


def _run_on_ranks(orders_by_m: dict[int, list[list[Action]]], sizes: list[int], X, y) -> list[Any]:
    import torch.distributed as dist

    from distlab import launch
    from distlab.pipeline.train import pipeline_step

    p = dist.get_world_size()  # stages on the rank's device (a GPU under NCCL); results come back on the CPU
    return [pipeline_step(sizes, X, y, add_communication("yours", orders, p, m), device=launch.device())
            for m, orders in orders_by_m.items()]


def _real_cases(fn: Callable[[int, int], Any]) -> list[CaseResult]:
    """Run fn's order for p = RUN_P on real ranks, one launch, and compare with one process."""
    from distlab import launch
    from distlab.models import regression_data
    from distlab.pipeline.parity import merge, step_parity
    from distlab.pipeline.train import reference_step

    sizes = [8, 32, 32, 32, 4]
    X, y = regression_data(40, 8, 4, seed=1)
    orders_by_m = {m: _as_orders(fn(RUN_P, m), RUN_P, m) for m in RUN_MS}
    results = launch.run(_run_on_ranks, RUN_P, orders_by_m, sizes, X, y)
    reference = reference_step(sizes, X, y)
    cases = []
    for k, m in enumerate(RUN_MS):
        parity = step_parity(merge([r[k] for r in results]), reference)
        lines = [parity.verdict()] + ([] if parity.passed else [str(parity)])
        cases.append(CaseResult(f"{RUN_P} real ranks, m={m}", parity.passed, lines))
    return cases


def check_one_f_one_b(fn: Callable[[int, int], Any], run: bool = True,
                      shapes: Sequence[tuple[int, int]] = CASES) -> CheckResult:
    """Check a student's 1F1B compute order `fn(p, m)` (Narayanan et al. 2019, sec. 3.2; 2021, sec.
    2.2.1) on each (p, m) of `shapes`; return the report (truthy when every case passed; a table in a
    notebook). `run`: also train on real ranks once the orders are right."""
    cases = [_paper_case(fn, p, m) for p, m in shapes]
    if run and all(c.passed for c in cases):
        cases += _real_cases(fn)
    return CheckResult(EXERCISE, cases, case_heading="case")


# --------------------------------------------------------------------------------------------------
# Exercise 2: the ZB-H1 order of one rank
# --------------------------------------------------------------------------------------------------

ZB_CASES = ((1, 3, 0), (2, 2, 0), (2, 4, 1), (3, 3, 1), (3, 5, 2), (4, 2, 1), (4, 8, 0), (4, 8, 2), (4, 8, 3),
            (4, 9, 3))  # (p, m, rank); m < p included
ZB_EXERCISE = "check_zb_h1_rank"


def _one_rank(raw: Any, m: int, r: int) -> list[Action]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ValueError(f"fn must return rank {r}'s list of (op, microbatch) pairs, got {raw!r:.80}")
    order = []
    for it in raw:
        op, mb = (it.op, it.microbatch) if isinstance(it, Action) else it
        order.append(Action(str(op), int(mb), r))
    if any(a.op not in ("F", "B", "W") for a in order):
        raise ValueError(f"rank {r} has ops other than 'F', 'B' and 'W'")
    for op in ("F", "B", "W"):
        _check_once_each(order, op, m, r)
    return order


def _check_once_each(order: list[Action], op: str, m: int, r: int) -> None:
    """Rank r's order runs `op` exactly once for each of the m micro-batches."""
    got = sorted(a.microbatch for a in order if a.op == op)
    if got != list(range(m)):
        missing = sorted(set(range(m)) - set(got))
        why = f"missing {op} for microbatch(es) {missing}" if missing else f"one {op} per microbatch"
        extra = ": without its W, a microbatch's weight gradient never reaches .grad" if op == "W" else ""
        raise ValueError(f"rank {r} runs {op} for microbatches {got}; {why}{extra}")


def _local_order(order: list[Action]) -> str | None:
    """A W before its B, or a B before its F, on this rank."""
    done: set[tuple[str, int]] = set()
    for k, a in enumerate(order):
        need = {"B": "F", "W": "B"}.get(a.op)
        if need and (need, a.microbatch) not in done:
            rule = ("W needs the output gradients that its B computes" if a.op == "W"
                    else "a backward needs the activations its forward stashed")
            return f"step {k}: {a.op}{a.microbatch} comes before {need}{a.microbatch}; {rule}"
        done.add((a.op, a.microbatch))
    return None


def _zb_case(fn: Callable[[int, int, int], Any], p: int, m: int, r: int) -> CaseResult:
    """Rank r's order from fn, with the reference ZB-H1 order on the other ranks."""
    from distlab.pipeline.zero_bubble import zb_h1_order

    label = f"p={p}, m={m}, rank {r}"
    reference = zb_h1_order(p, m)
    try:
        mine = _one_rank(fn(p, m, r), m, r)
    except NotImplementedError:
        return CaseResult(label, False, [NOT_WRITTEN])
    except (TypeError, ValueError) as e:
        return CaseResult(label, False, [str(e)])
    orders = [mine if q == r else reference[q] for q in range(p)]
    problem = _zb_problem(mine, orders, p, m, r)
    if problem:
        return CaseResult(label, False, problem.split("\n"))
    return _zb_bubble(label, mine, orders, reference, p, m, r)


def _zb_problem(mine: list[Action], orders: list[list[Action]], p: int, m: int, r: int) -> str | None:
    """What makes rank r's order invalid: a pass before the one it needs, a deadlock with the other
    ranks, or more microbatches held than ZB-H1 holds; None if nothing."""
    from distlab.pipeline.cost_model import predicted_peak_stash

    problem = _local_order(mine)
    if problem is None:
        try:
            check_compute_order("your ZB-H1", orders, p)
        except DeadlockError as e:
            problem = str(e)
    if problem is None and peak_stash(mine) > predicted_peak_stash("zbh1", p, m)[r]:
        problem = (f"rank {r} holds {peak_stash(mine)} microbatches at once (F done, W not yet); ZB-H1 "
                   f"holds at most min(p, m) = {min(p, m)}, 1F1B's peak: keep only r = {r} W's in hand, run "
                   "the older one after each B")
    return problem


def _zb_bubble(label: str, mine: list[Action], orders: list[list[Action]], reference: list[list[Action]],
               p: int, m: int, r: int) -> CaseResult:
    """A valid order: its bubble in the simulator (t_f = t_b = t_w) against ZB-H1's, and the first step
    where it departs from the reference if its bubble is larger."""
    yours, ref = (timeline_stats(simulate(add_communication("x", o, p, m), 1.0, 1.0, t_w=1.0), p)
                  for o in (orders, reference))
    if yours.makespan > ref.makespan + 1e-9:
        k = next(k for k, (a, b) in enumerate(zip(mine, reference[r], strict=False)) if a != b)
        why = (f"a W this early delays the F's and B's that other ranks wait for; rank {r} can keep {r} W's "
               "for the drain" if mine[k].op == "W" else "a B that comes late keeps the ranks before this "
               "one waiting, while a W can wait: run B as soon as its gradient can have arrived")
        return CaseResult(label, False, [
            f"the bubble grows from {ref.mean_bubble:.1%} to {yours.mean_bubble:.1%} (t_f = t_b = t_w): at "
            f"step {k} you run {mine[k].op}{mine[k].microbatch} where ZB-H1 runs "
            f"{reference[r][k].op}{reference[r][k].microbatch}; {why}"])
    note = "" if mine == reference[r] else " (order differs from the reference, same bubble)"
    return CaseResult(label, True, [f"valid, peak stash {peak_stash(mine)}, bubble {yours.mean_bubble:.1%} "
                                    f"= ZB-H1's{note}"])


def check_zb_h1_rank(fn: Callable[[int, int, int], Any],
                     shapes: Sequence[tuple[int, int, int]] = ZB_CASES) -> CheckResult:
    """Check a student's ZB-H1 order of one rank, `fn(p, m, r)` -> [(op, microbatch), ...] with ops F, B
    and W (Qi et al. 2023), with the reference order on the other ranks: each pass once, no W before
    its B, no deadlock, at most min(p, m) microbatches held, and ZB-H1's bubble in the simulator, on each
    (p, m, rank) of `shapes`."""
    return CheckResult(ZB_EXERCISE, [_zb_case(fn, p, m, r) for p, m, r in shapes], case_heading="case")
