"""The check of the planner lab's exercise: predict the data-parallel term of the step-time model."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult, is_stub
from distlab.collectives.cost_model import MachineParams
from distlab.plan.candidates import Candidate
from distlab.plan.cost_model import dp_time

# (gradient bytes, dp ranks, ZeRO stage, micro-batches, latency s, GB/s per direction)
DP_CASES = ((4e9, 8, 0, 16, 5e-6, 25.0), (4e9, 8, 1, 16, 5e-6, 25.0), (4e9, 8, 2, 16, 5e-6, 25.0),
            (4e9, 8, 3, 16, 5e-6, 25.0), (1e6, 3, 0, 4, 5e-6, 50.0), (1e6, 3, 3, 4, 5e-6, 50.0),
            (2e9, 1, 0, 8, 5e-6, 25.0))


def check_dp_term(fn: Callable[[float, int, int, int, float, float], float],
                  settings: Sequence[tuple[float, int, int, int, float, float]] = DP_CASES) -> CheckResult:
    """`fn(grad_bytes, dp, zero, m, alpha, GBps)` must give the seconds `cost_model.dp_time` gives: chapter
    1's ring all-reduce for ZeRO 0 and 1, m reduce-scatters and one all-gather for ZeRO 2, m reduce-scatters
    and 2 m all-gathers for ZeRO 3, nothing for dp = 1 (relative tolerance 1e-9), for each of `settings`
    (default `DP_CASES`)."""
    cases = []
    for grad, dp, zero, m, alpha, gbps in settings:
        want = dp_time(Candidate(dp, 1, 1, 1, zero, "none", 1), grad, m, MachineParams(alpha, 1e-9 / gbps))
        try:
            got = float(fn(grad, dp, zero, m, alpha, gbps))
        except Exception as e:  # the student's function, any error
            cases.append(CaseResult(f"dp={dp} zero={zero} m={m}", False,
                                    [NOT_WRITTEN if is_stub(e) else f"raised {e!r}"]))
            continue
        ok = math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15)
        hint = [] if ok else [f"expected {want:.6g} s, got {got:.6g} s" + (
            "; dp = 1 sends nothing" if dp == 1 else
            "; ZeRO 2 and 3 reduce-scatter every micro-batch" if zero >= 2 else
            "; a ring all-reduce is 2 (p - 1) steps of n/p bytes")]
        cases.append(CaseResult(f"dp={dp} zero={zero} m={m}", ok, hint))
    return CheckResult("the data-parallel term", cases, case_heading="case")
