"""The check of chapter 4's exercise: write the 1F1B compute order, and find out what is wrong with it.

The student writes `fn(p, m)`, returning for each rank r the list of its forward and backward passes in
order, as ("F", i) / ("B", i) pairs (or `Action`s). `check_one_f_one_b(fn)` then
1. checks the structure on paper for many (p, m), including m < p: every microbatch has one F and one
   B, each B after its F; the order cannot deadlock (and if it does, which ranks wait for what); the
   warm-up of each rank is min(p - r - 1, m) forwards, and the peak stash at most p - r;
2. simulates it with t_b = 2 t_f and compares the bubble with (p - 1) / (m + p - 1);
3. runs it on real ranks (one launch for p = 4 with several m) through the executor and compares the
   gradients with single-process training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from distlab.pipeline.actions import Action
from distlab.pipeline.communication import DeadlockError, add_communication, check_compute_order
from distlab.pipeline.schedules import bubble_fraction, one_f_one_b_order
from distlab.pipeline.simulate import peak_stash, simulate, timeline_stats

CASES = ((1, 1), (1, 3), (2, 1), (2, 2), (2, 5), (3, 2), (3, 4), (4, 3), (4, 8))  # m < p included
RUN_P, RUN_MS = 4, (2, 5, 8)


@dataclass
class Report:
    """The verdict: `ok`, and one line per finding."""

    ok: bool = True
    lines: list[str] = field(default_factory=list)

    def fail(self, line: str) -> None:
        self.ok = False
        self.lines.append("FAIL " + line)

    def __str__(self) -> str:
        head = "check_one_f_one_b: all checks passed" if self.ok else "check_one_f_one_b: problems found"
        return "\n".join([head, *("  " + x.replace("\n", "\n       ") for x in self.lines)])


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


def _paper_checks(fn: Callable[[int, int], Any], report: Report) -> bool:
    for p, m in CASES:
        try:
            orders = _as_orders(fn(p, m), p, m)
        except (TypeError, ValueError) as e:
            report.fail(f"p={p}, m={m}: {e}")
            return False
        for r, order in enumerate(orders):
            fs = [a.microbatch for a in order if a.op == "F"]
            bs = [a.microbatch for a in order if a.op == "B"]
            if sorted(bs) != list(range(m)):
                missing = sorted(set(range(m)) - set(bs))
                report.fail(f"p={p}, m={m}: rank {r} runs backwards {bs}; "
                            + (f"missing backward for microbatch(es) {missing}: their gradients would never "
                               "reach the weights" if missing else "each microbatch needs exactly one B"))
                return False
            if sorted(fs) != list(range(m)):
                report.fail(f"p={p}, m={m}: rank {r} runs forwards {fs}; each microbatch needs exactly one F")
                return False
            if any(o.op not in ("F", "B") for o in order):
                report.fail(f"p={p}, m={m}: rank {r} has ops other than 'F' and 'B'")
                return False
        try:
            check_compute_order("your 1F1B", orders, p)
        except DeadlockError as e:
            report.fail(f"p={p}, m={m}: {e}")
            return False
        for r, order in enumerate(orders):
            warmup = next((i for i, a in enumerate(order) if a.op == "B"), len(order))
            want = min(p - r, m)
            if warmup != want:
                report.fail(f"p={p}, m={m}: rank {r} runs {warmup} forwards before its first backward; "
                            f"1F1B runs min(p - r, m) = {want}: a warm-up of min(p - r - 1, m), then one "
                            "more as the steady state starts"
                            + (": more is correct but stashes more activations" if warmup > want else ""))
                return False
            if peak_stash(order) > min(p - r, m):
                report.fail(f"p={p}, m={m}: rank {r} holds {peak_stash(order)} microbatches at once; 1F1B "
                            f"holds at most min(p - r, m) = {min(p - r, m)}: after the warm-up, alternate "
                            "one F and one B")
                return False
        sim = timeline_stats(simulate(add_communication("yours", orders, p, m)), p).mean_bubble
        if abs(sim - bubble_fraction(p, m)) > 1e-9:
            report.fail(f"p={p}, m={m}: simulated bubble {sim:.3f}, but 1F1B's is (p-1)/(m+p-1) = "
                        f"{bubble_fraction(p, m):.3f}; compare your order with one_f_one_b_order({p}, {m})")
            return False
        same = orders == one_f_one_b_order(p, m)
        report.lines.append(f"ok   p={p}, m={m}: no deadlock, warm-up and stash right, bubble {sim:.3f} = "
                            f"formula" + ("" if same else " (order differs from the reference but is valid)"))
    return True


def _run_on_ranks(orders_by_m: dict[int, list[list[Action]]], sizes: list[int], X, y) -> list[Any]:
    import torch.distributed as dist

    from distlab.pipeline.train import pipeline_step

    rank, p = dist.get_rank(), dist.get_world_size()
    return [pipeline_step(sizes, X, y, add_communication("yours", orders, p, m), rank)
            for m, orders in orders_by_m.items()]


def check_one_f_one_b(fn: Callable[[int, int], Any], run: bool = True) -> Report:
    """Check a student's 1F1B compute order `fn(p, m)`; print and return the `Report`."""
    from distlab import launch
    from distlab.models import regression_data
    from distlab.pipeline.train import max_difference, merge, reference_step

    report = Report()
    if _paper_checks(fn, report) and run:
        sizes = [8, 32, 32, 32, 4]
        X, y = regression_data(40, 8, 4, seed=1)
        orders_by_m = {m: _as_orders(fn(RUN_P, m), RUN_P, m) for m in RUN_MS}
        results = launch.run(_run_on_ranks, RUN_P, orders_by_m, sizes, X, y)
        ref_grads, ref_params = reference_step(sizes, X, y)
        for k, m in enumerate(RUN_MS):
            grads, params = merge([r[k] for r in results])
            err = max(max_difference(grads, ref_grads), max_difference(params, ref_params))
            if err > 1e-5:
                report.fail(f"on {RUN_P} ranks with m={m}: gradients differ from one process by {err:.2e}")
            else:
                report.lines.append(f"ok   on {RUN_P} real ranks, m={m}: gradients and updated weights equal "
                                    "single-process training (max difference below 1e-5)")
    print(report)
    return report
