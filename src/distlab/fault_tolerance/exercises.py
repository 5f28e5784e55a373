"""The checks of lab 11's exercises: the useful fraction of a run whose replicas heal (part 2) and DiLoCo's
outer step (part 3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from distlab.checks import CaseResult, CheckResult, not_written
from distlab.fault_tolerance.diloco import OuterNesterov
from distlab.fault_tolerance.goodput import healing_goodput

CASES = ((3600.0, 2.0, 1.0, 10.0, 8, 300.0), (86400.0, 0.5, 0.5, 5.0, 2, 0.0),
         (864.0, 2.0, 1.0, 10.0, 8, 300.0), (100.0, 10.0, 50.0, 100.0, 2, 1000.0))


def check_healing_fraction(fn: Callable[..., float], settings: Sequence[tuple] = CASES) -> CheckResult:
    """`fn(mtbf, step_s, detect, heal, replicas, replace)` must return the useful fraction
    1 - (t_d + t + (t_r + t_h) / R) / M, at least 0 (`goodput.healing_goodput`), for each of `settings`
    (those six arguments; default `CASES`)."""
    cases = []
    for args in settings:
        label = "M={:g} s, t={:g} s, t_d={:g} s, t_h={:g} s, R={}, t_r={:g} s".format(*args)
        want = healing_goodput(*args)["fraction"]
        try:
            got = fn(*args)
        except NotImplementedError:  # the student version's stub
            cases.append(not_written(label))
            continue
        ok = isinstance(got, int | float) and abs(got - want) <= 1e-9
        lines = [] if ok else [f"returned {got!r}; expected {want:.6f}: each failure costs t_d + t, and "
                               "(t_r + t_h) / R of the time, out of M; a fraction below 0 is 0"]
        cases.append(CaseResult(label, ok, lines))
    return CheckResult("the useful fraction of healing replicas", cases, case_heading="case")


# (replicas R, outer lr, momentum mu, whether a momentum buffer exists yet): the paper's 0.7 and 0.9, a
# first round (no buffer), outer lr 1 without momentum (DiLoCo is then local SGD), and one replica.
OUTER_CASES = ((2, 0.7, 0.9, True), (3, 0.7, 0.9, False), (4, 1.0, 0.0, True), (1, 0.5, 0.5, True))


def outer_step_reference(theta: Tensor, thetas: list[Tensor], buffer: Tensor | None, lr: float,
                         mu: float) -> tuple[Tensor, Tensor]:
    """DiLoCo's outer step (Douillard et al. 2023, Algorithm 1) through the chapter's `OuterNesterov`:
    Delta = mean_r(theta - theta_r), b <- mu b + Delta (b = Delta at first), theta - lr (Delta + mu b)."""
    delta = torch.stack([theta - t for t in thetas]).mean(0)
    outer, params = OuterNesterov(lr, momentum=mu), [theta.clone()]
    if mu and buffer is not None:
        outer.buffers = [buffer.clone()]
    outer.step(params, [delta])
    return params[0], (outer.buffers[0] if mu else delta)


def _outer_mistake(got: Tensor, theta: Tensor, thetas: list[Tensor], buffer: Tensor | None, lr: float,
                   mu: float) -> str:
    """Name the usual mistake that gives `got`, or say what was expected."""
    mean = torch.stack(thetas).mean(0)

    def nesterov(delta: Tensor, plain: bool = False) -> Tensor:
        b = delta if buffer is None else mu * buffer + delta
        return theta - lr * (b if plain else delta + mu * b)

    delta = theta - mean
    wrong = {"the pseudo-gradient is theta - theta_r (where a replica started minus where it ended), "
             "not theta_r - theta": nesterov(-delta),
             "Nesterov steps by Delta + mu b, not by the buffer b alone (that is plain momentum)":
                 nesterov(delta, plain=True),
             "the replicas' pseudo-gradients are averaged (divide by R), not summed":
                 nesterov(len(thetas) * delta),
             "that is the replicas' mean (local SGD): DiLoCo steps from theta by the outer optimizer": mean}
    right = nesterov(delta)
    for why, value in wrong.items():
        if torch.allclose(got, value, rtol=0, atol=1e-12) and not torch.allclose(value, right, rtol=0,
                                                                                    atol=1e-12):
            return why
    return "expected theta - lr (Delta + mu b) with Delta = mean_r(theta - theta_r) and b = mu b + Delta"


def check_outer_step(fn: Callable[..., tuple[Tensor, Tensor]],
                     settings: Sequence[tuple[int, float, float, bool]] = OUTER_CASES) -> CheckResult:
    """`fn(theta, thetas, buffer, lr, mu)` must return DiLoCo's new global parameters and momentum buffer
    (`outer_step_reference`), in float64 within 1e-12; `buffer` is None in the first round. `settings`:
    (R, lr, mu, whether a buffer exists), default `OUTER_CASES`."""
    cases = [_outer_case(fn, r, lr, mu, has_buffer) for r, lr, mu, has_buffer in settings]
    return CheckResult("DiLoCo's outer step", cases, case_heading="case")


def _outer_case(fn: Callable[..., tuple[Tensor, Tensor]], r: int, lr: float, mu: float,
                has_buffer: bool) -> CaseResult:
    """One setting of `check_outer_step`: `fn`'s answer for R seeded replicas against the reference."""
    theta, thetas, buffer = _outer_inputs(r, has_buffer)
    label = f"R={r}, lr={lr:g}, mu={mu:g}, " + ("a buffer" if has_buffer else "first round")
    want_theta, want_buffer = outer_step_reference(theta, thetas, buffer, lr, mu)
    try:
        got_theta, got_buffer = fn(theta.clone(), [t.clone() for t in thetas],
                                   None if buffer is None else buffer.clone(), lr, mu)
    except NotImplementedError:  # the student version's stub
        return not_written(label)
    lines = []
    ok_shape = isinstance(got_theta, Tensor) and got_theta.shape == theta.shape
    if not (ok_shape and torch.allclose(got_theta, want_theta, rtol=0, atol=1e-12)):
        got = got_theta if ok_shape else torch.full_like(theta, float("nan"))
        lines.append("new theta: " + _outer_mistake(got, theta, thetas, buffer, lr, mu))
    if mu and not (isinstance(got_buffer, Tensor) and torch.allclose(got_buffer, want_buffer, rtol=0,
                                                                        atol=1e-12)):
        lines.append("new buffer: expected mu b + Delta (Delta itself in the first round)")
    return CaseResult(label, not lines, lines)


def _outer_inputs(r: int, has_buffer: bool) -> tuple[Tensor, list[Tensor], Tensor | None]:
    """The global parameters, R replicas' parameters near them and a buffer (or None), seeded by R."""
    gen = torch.Generator().manual_seed(r)
    theta = torch.randn(5, generator=gen, dtype=torch.float64)
    thetas = [theta - 0.1 * torch.randn(5, generator=gen, dtype=torch.float64) for _ in range(r)]
    buffer = torch.randn(5, generator=gen, dtype=torch.float64) if has_buffer else None
    return theta, thetas, buffer
