"""The check of lab 5's exercise: the f/g pair and a row-parallel linear layer, written by the student.

The student writes four things (Shoeybi et al. 2019, sec. 3):

- `f(x)`: identity forward, all-reduce backward; `g(x)`: all-reduce forward, identity backward (for
  example `MyF.apply` and `MyG.apply` of two `torch.autograd.Function`s);
- `shard(weight, rank, size)`: rank's block of a dense nn.Linear weight (out, in) for a row-parallel
  layer;
- `row_linear(x_parallel, weight_shard, bias)`: the row-parallel layer's output, equal to the dense
  x W^T + b on every rank.

`check_tensor_parallel` runs each piece on real ranks in float64 against the dense computation and
explains the classic mistakes by their fingerprints: a bias that counts p times, a partial sum that was
never added up, gradients p times too large (an all-reduce in the wrong direction), a gradient that is
only one rank's share (a missing all-reduce in f), and a weight shard cut along the wrong dimension or
taken from another rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult, is_stub, not_written

BATCH, HIDDEN = 3, 12  # a square layer, so that a shard cut along the wrong dimension still runs


def _close(a: Any, b: Tensor) -> bool:
    return isinstance(a, Tensor) and a.shape == b.shape and torch.allclose(a.double(), b, atol=1e-10)


def _data(rank: int, p: int, device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """The check's tensors, drawn on the CPU (the same on every machine) and moved to `device`."""
    gen = torch.Generator().manual_seed(5)
    d = {k: torch.randn(*shape, generator=gen, dtype=torch.float64, device="cpu")
         for k, shape in (("x", (BATCH, HIDDEN)), ("w", (HIDDEN, HIDDEN)), ("b", (HIDDEN,)),
                          ("dy", (BATCH, HIDDEN)))}
    d["own"] = torch.randn(p, BATCH, HIDDEN, generator=gen, dtype=torch.float64, device="cpu")  # one per rank
    return {k: v.to(device) for k, v in d.items()}


def _check_shard(shard: Callable, d: dict[str, Tensor], rank: int, p: int) -> list[str]:
    k = HIDDEN // p
    want = d["w"][:, rank * k:(rank + 1) * k]
    try:
        got = shard(d["w"].clone(), rank, p)
    except NotImplementedError:
        raise
    except Exception as e:  # report the student's error as a finding
        return [f"shard(weight, {rank}, {p}) raised {type(e).__name__}: {e}"]
    if _close(got, want):
        return []
    if _close(got, d["w"][rank * k:(rank + 1) * k]):
        return [f"shard gives rank {rank} rows {rank * k}..{(rank + 1) * k - 1} of the weight: that is a "
                "column-parallel shard. nn.Linear stores W as (out, in), and a row-parallel layer splits the "
                f"input dimension: take columns, weight[:, {rank * k}:{(rank + 1) * k}]"]
    for other in range(p):
        if other != rank and _close(got, d["w"][:, other * k:(other + 1) * k]):
            return [f"shard gives rank {rank} the columns of rank {other}: start at rank * in_features / p"]
    shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
    return [f"shard(weight, {rank}, {p}) returned {shape}, not columns {rank * k}..{(rank + 1) * k - 1} "
            f"(shape {tuple(want.shape)})"]


def _check_g(g: Callable, d: dict[str, Tensor], rank: int, p: int) -> list[str]:
    x = d["own"][rank].clone().requires_grad_(True)
    y = g(x)
    total = d["own"].sum(0)
    problems = []
    if _close(y, x.detach()) and p > 1:
        problems.append("g(x) returned this rank's own x: g must all-reduce (sum over ranks) in forward")
    elif not _close(y, total):
        problems.append("g(x) is not the sum of every rank's x in forward")
    if isinstance(y, Tensor) and y.requires_grad:
        (y * d["dy"]).sum().backward()
        if _close(x.grad, p * d["dy"]) and p > 1:
            problems.append(f"g's backward all-reduces: the gradient is p = {p} times too large. g is the "
                            "identity in backward (the gradient of a sum w.r.t. each term is the same)")
        elif not _close(x.grad, d["dy"]):
            problems.append("g's backward does not pass the gradient through unchanged")
    else:
        problems.append("g(x) is not connected to x in autograd: return a tensor computed by an "
                        "autograd.Function (MyG.apply(x)), not a detached copy")
    return problems


def _check_f(f: Callable, d: dict[str, Tensor], rank: int, p: int) -> list[str]:
    x = d["x"].clone().requires_grad_(True)
    y = f(x)
    problems = []
    if _close(y, p * d["x"]) and p > 1:
        problems.append(f"f(x) is p = {p} times x in forward: f must be the identity in forward (the "
                        "all-reduce belongs to its backward)")
    elif not _close(y, d["x"]):
        problems.append("f(x) differs from x in forward: f is the identity in forward")
    if not (isinstance(y, Tensor) and y.requires_grad):
        return problems + ["f(x) is not connected to x in autograd: return MyF.apply(x)"]
    (y * d["own"][rank]).sum().backward()  # each rank's upstream gradient is different
    if _close(x.grad, d["own"][rank]) and p > 1:
        problems.append("f's backward returns only this rank's gradient: it must all-reduce it, because the "
                        "input fed every rank's columns and its gradient is the sum of their shares")
    elif not _close(x.grad, d["own"].sum(0)):
        problems.append("f's backward is not the sum over ranks of the incoming gradients")
    return problems


def _check_row_linear(row_linear: Callable, d: dict[str, Tensor], rank: int, p: int) -> list[str]:
    k = HIDDEN // p
    cols = slice(rank * k, (rank + 1) * k)
    x, w, b = (d[n].clone().requires_grad_(True) for n in ("x", "w", "b"))
    ref = x @ w.T + b
    (ref * d["dy"]).sum().backward()
    xs, ws, bs = (t.detach().clone().requires_grad_(True) for t in (d["x"][:, cols], d["w"][:, cols], d["b"]))
    y = row_linear(xs, ws, bs)
    partial = (d["x"][:, cols] @ d["w"][:, cols].T)
    wrong = _row_output_problem(y, ref.detach(), partial, d["b"], p)
    if wrong:
        return wrong
    if not (isinstance(y, Tensor) and y.requires_grad):
        return ["the output is not connected to the inputs in autograd"]
    (y * d["dy"]).sum().backward()
    shards = (("weight shard", ws, w.grad[:, cols]), ("input shard", xs, x.grad[:, cols]),
              ("bias", bs, b.grad))
    return _row_gradient_problems(shards, p)


def _row_output_problem(y: Tensor, ref: Tensor, partial: Tensor, bias: Tensor, p: int) -> list[str]:
    """What is wrong with the row-parallel layer's output y against the dense `ref` ([] when right)."""
    if _close(y, ref):
        return []
    if p > 1 and _close(y, ref + (p - 1) * bias):
        return [f"the output holds the bias p = {p} times: every rank added it before the all-reduce. Add "
                "the bias once, after g"]
    if p > 1 and (_close(y, partial + bias) or _close(y, partial)):
        return ["the output is this rank's partial sum x_r W_r^T: the partial sums were never added up "
                "(call g on x_r W_r^T: all-reduce in forward)"]
    if _close(y, ref - bias):
        return ["the output has no bias: add it once, after g"]
    return ["the output differs from the dense x W^T + b"]


def _row_gradient_problems(grads: tuple[tuple[str, Tensor, Tensor], ...], p: int) -> list[str]:
    """What is wrong with each (name, shard, the dense layer's gradient of it) after backward."""
    problems = []
    for name, t, want in grads:
        if t.grad is None:
            problems.append(f"the {name} received no gradient")
        elif p > 1 and _close(t.grad, p * want):
            problems.append(f"the gradient of the {name} is p = {p} times too large: an all-reduce runs in "
                            "backward where g must be the identity")
        elif not _close(t.grad, want):
            problems.append(f"the gradient of the {name} differs from the dense layer's")
    return problems


def run_checks(f: Callable, g: Callable, shard: Callable, row_linear: Callable) -> list[str]:
    """On one rank: every problem found with the four pieces, [] when all are right."""
    from distlab import launch

    rank, p = dist.get_rank(), dist.get_world_size()
    d = _data(rank, p, launch.device())  # on the rank's device: its GPU under NCCL
    problems = []
    for name, check, fn in (("shard", _check_shard, shard), ("g", _check_g, g), ("f", _check_f, f),
                            ("row_linear", _check_row_linear, row_linear)):
        try:
            problems += [f"{name}: {msg}" for msg in check(fn, d, rank, p)]
        except NotImplementedError:
            problems.append(f"{name}: {NOT_WRITTEN}")
        except Exception as e:  # a student's exception is a finding, not a crash
            problems.append(f"{name} raised {type(e).__name__}: {e}")
        dist.barrier()
    return problems


def check_tensor_parallel(f: Callable, g: Callable, shard: Callable, row_linear: Callable,
                          world_sizes: Sequence[int] = (2, 3), timeout: float = 20.0) -> CheckResult:
    """Run the student's f, g, shard and row_linear on each world size (one launch each) and explain any
    difference from the dense layer (float64, tolerance 1e-10)."""
    _check_arguments(f, g, shard, row_linear, world_sizes)
    cases: list[CaseResult] = []
    for p in world_sizes:
        label = f"{p} rank{'s' if p > 1 else ''}"
        if cases and len(cases[-1].lines) == 4 and all(x.endswith(NOT_WRITTEN) for x in cases[-1].lines):
            cases.append(CaseResult(label, False, list(cases[-1].lines)))  # all four still stubs: no launch
            continue
        cases.append(_run_case(label, p, (f, g, shard, row_linear), timeout))
    return CheckResult("check_tensor_parallel", cases)


def _check_arguments(f: Callable, g: Callable, shard: Callable, row_linear: Callable,
                     world_sizes: Sequence[int]) -> None:
    for name, fn in (("f", f), ("g", g), ("shard", shard), ("row_linear", row_linear)):
        if not callable(fn):
            raise ValueError(f"{name}={fn!r} is not callable: pass the function itself, e.g. "
                             f"{name}=MyF.apply or the def'd function, without calling it")
    bad = [p for p in world_sizes if isinstance(p, bool) or not isinstance(p, int) or p < 1
           or HIDDEN % p]
    if bad:
        raise ValueError(f"world_sizes={tuple(world_sizes)} must hold sizes that divide {HIDDEN} "
                         "(the layer's width): choose from 1, 2, 3, 4, 6")


def _run_case(label: str, p: int, pieces: tuple[Callable, ...], timeout: float) -> CaseResult:
    """One launch on p ranks, its findings folded into one case."""
    from distlab import launch

    try:
        per_rank = launch.run(run_checks, p, *pieces, timeout=timeout)
    except launch.RankError as err:
        return (not_written(label) if is_stub(err) else
                CaseResult(label, False, [f"rank {err.rank} failed: {str(err).splitlines()[0]}"]))
    lines: list[str] = []
    for r, problems in enumerate(per_rank):  # a stub is the same on every rank: say it once, unranked
        lines += [msg if msg.endswith(NOT_WRITTEN) else f"rank {r}: {msg}" for msg in problems
                  if f"{msg}" not in " ".join(lines)]
    return CaseResult(label, not lines, lines[:6])
