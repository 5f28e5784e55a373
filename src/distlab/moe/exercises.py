"""Checks for chapter 6's exercises: top-k gating with capacity, then dispatch and combine.

`check_top_k_gating(my_top_k_gating)` calls `fn(logits, k, capacity)`, which must return the (T, E)
combine weights: the weight of expert e's output in token t's result, 0 where e was not chosen or the
assignment was dropped. The convention is the chapter's (`distlab.moe.gating`): softmax over all E,
top-k, renormalise the k gates when k > 1, then capacity with priority "all first choices in token
order, then all second choices". When the result differs, the check recomputes the weights under the
usual mistakes and names the one that matches: softmax after the top-k, gates not renormalised,
capacity not enforced, another drop order (token by token, last tokens first, by probability), or
renormalising after dropping.

`check_dispatch_combine(my_dispatch_combine)` calls `fn(x, combine, experts)`, which must return
y[t] = sum_e combine[t, e] * experts[e](x[t]), running each expert once, on its routed tokens only.
The experts count the rows they see, so the check can tell a dense computation from a sparse one, and
it recognises outputs without the gate weights or with the residual already added.

`check_expert_parallel(my_expert_parallel_forward)` (the book's exercise 3) runs `fn(layer, x)`, an
`ExpertParallelMoE` forward pass written by hand, on 2 and 4 ranks and compares outputs and input
gradients with the reference; it recognises missing gates, missing results and a lost gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult, is_stub, not_written
from distlab.moe.gating import top_k_gating
from distlab.moe.layer import ExpertFFN

ORDERS = ("choice", "token", "reverse", "probability")


def combine_weights(logits: Tensor, k: int, capacity: int, *, softmax_after_top_k: bool = False,
                    normalize: bool = True, order: str = "choice", renormalize_after_drop: bool = False
                    ) -> Tensor:
    """(T, E) combine weights under a chosen convention (the defaults are the chapter's, and equal
    `top_k_gating(...).combine_weights()`); the other settings reproduce common mistakes.

    order: "choice" (all first choices in token order, then second choices: GShard's Algorithm 1),
    "token" (token 0's choices, then token 1's, ...), "reverse" (last token first), "probability"
    (highest router probability first, the "batch prioritized routing" of Riquelme et al. 2021).
    """
    t, e = logits.shape
    probs = torch.softmax(logits.double(), -1)
    top, index = probs.topk(k, -1)
    if softmax_after_top_k:
        gates = torch.softmax(logits.double().gather(1, index), -1)
    else:
        gates = top / top.sum(-1, keepdim=True) if (normalize and k > 1) else top
    tokens = torch.arange(t).repeat_interleave(k).view(t, k)
    choices = torch.arange(k).repeat(t, 1)
    if order == "choice":
        sequence = sorted(range(t * k), key=lambda i: (choices.view(-1)[i], tokens.view(-1)[i]))
    elif order == "token":
        sequence = list(range(t * k))
    elif order == "reverse":
        sequence = sorted(range(t * k), key=lambda i: (choices.view(-1)[i], -tokens.view(-1)[i]))
    elif order == "probability":
        sequence = sorted(range(t * k), key=lambda i: -float(top.view(-1)[i]))
    else:
        raise ValueError(f"order={order!r} is unknown; choose one of {ORDERS}")
    load = [0] * e
    kept = torch.zeros(t, k, dtype=torch.bool)
    for i in sequence:
        tok, c = divmod(i, k)
        ex = int(index[tok, c])
        if load[ex] < capacity:
            load[ex] += 1
            kept[tok, c] = True
    gates = gates * kept
    if renormalize_after_drop:
        total = gates.sum(-1, keepdim=True)
        gates = torch.where(total > 0, gates / total.clamp_min(1e-300), gates)
    return torch.zeros(t, e, dtype=torch.float64).scatter_add(1, index, gates)


GATING_SHAPES = ((12, 4, 1, 3), (12, 4, 2, 5), (16, 6, 2, 4), (9, 3, 3, 7))  # (T, E, k, capacity)
DISPATCH_ROUTINGS = ((12, 4, 1, 1.0), (20, 4, 2, 0.75))  # (T, E, k, capacity factor)


def _gating_cases(shapes: Sequence[tuple[int, int, int, int]] = GATING_SHAPES, seed: int = 6
                  ) -> list[tuple[str, Tensor, int, int]]:
    """(label, logits, k, capacity): skewed logits, so that some experts overflow."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for t, e, k, c in shapes:
        logits = torch.randn(t, e, generator=g, dtype=torch.float64) + torch.linspace(1.5, 0, e).double()
        cases.append((f"T={t}, E={e}, k={k}, capacity={c}", logits, k, c))
    return cases


def _diagnose_gating(got: Any, logits: Tensor, k: int, c: int) -> list[str]:
    t, e = logits.shape
    if not isinstance(got, Tensor):
        return [f"returned a {type(got).__name__}; return the (T, E) = ({t}, {e}) tensor of combine weights"]
    if tuple(got.shape) != (t, e):
        return [f"returned shape {tuple(got.shape)}; the combine weights have shape (T, E) = ({t}, {e})"]
    got = got.detach().double()
    want = combine_weights(logits, k, c)
    if torch.allclose(got, want, atol=1e-6, rtol=0):
        return []
    named = _named_gating_mistake(got, logits, k, c)
    if named:
        return named
    over = [ex for ex in range(e) if int((got[:, ex] > 0).sum()) > c]
    if over:
        return [f"experts {over} have more than capacity = {c} tokens with a non-zero weight"]
    bad = torch.nonzero((got - want).abs() > 1e-6)[0].tolist()
    return [f"token {bad[0]}, expert {bad[1]}: weight {float(got[bad[0], bad[1]]):.4g}, expected "
            f"{float(want[bad[0], bad[1]]):.4g} (kept choices and their weights are listed by "
            "distlab.moe.exercises.combine_weights(logits, k, capacity))"]


def _named_gating_mistake(got: Tensor, logits: Tensor, k: int, c: int) -> list[str]:
    """The usual mistake whose weights equal `got` (each recomputed by `combine_weights`); [] if none."""
    t = logits.shape[0]

    def same(**kw: Any) -> bool:
        return torch.allclose(got, combine_weights(logits, k, **kw), atol=1e-6, rtol=0)

    if same(capacity=c, softmax_after_top_k=True):
        return ["the softmax was taken after the top-k, over the k chosen logits only: with k = 1 every "
                "gate becomes 1 and the router gets no gradient. Take the softmax over all E logits first, "
                "then keep the k largest probabilities"]
    if k > 1 and same(capacity=c, normalize=False):
        return [f"the k = {k} gates are not renormalised: divide the chosen probabilities by their sum, so "
                "each token's gates add up to 1 (GShard's top-2 gating)"]
    if same(capacity=t):
        load = (got > 0).sum(0).tolist()
        return [f"capacity is not enforced: experts received {load} tokens, but each may take at most "
                f"capacity = {c}; drop the assignments beyond it (set their weight to 0)"]
    return _drop_mistake(same, c)


def _drop_mistake(same: Callable[..., bool], c: int) -> list[str]:
    """The right capacity, but tokens dropped in another order or gates renormalised after dropping."""
    for order, what in (("token", "token by token (all of token 0's choices, then token 1's)"),
                        ("reverse", "from the last token backwards"),
                        ("probability", "by router probability, highest first")):
        if same(capacity=c, order=order):
            return [f"the right number of tokens is dropped, but in the wrong order: you filled the experts "
                    f"{what}. The convention here is all first choices in token order, then all second "
                    "choices in token order"]
    if same(capacity=c, renormalize_after_drop=True):
        return ["the gates were renormalised after dropping: a dropped choice should simply lose its share "
                "(normalise the k gates before the capacity check)"]
    return []


def check_top_k_gating(fn: Callable[[Tensor, int, int], Tensor],
                       shapes: Sequence[tuple[int, int, int, int]] = GATING_SHAPES,
                       seed: int = 6) -> CheckResult:
    """Run `fn(logits, k, capacity) -> (T, E) combine weights` on each (T, E, k, capacity) of `shapes`
    (random skewed logits from `seed`) and explain what is wrong."""
    if not callable(fn):
        raise ValueError(f"fn={fn!r} is not a function: pass your function itself, e.g. "
                         "check_top_k_gating(my_top_k_gating)")
    results = []
    for label, logits, k, c in _gating_cases(shapes, seed):
        try:
            lines = _diagnose_gating(fn(logits.clone(), k, c), logits, k, c)
        except Exception as err:  # a student's bug is a result, not a crash of the check
            lines = [NOT_WRITTEN] if is_stub(err) else [f"raised {type(err).__name__}: {err}"]
        results.append(CaseResult(label, not lines, lines))
    return CheckResult("check_top_k_gating", results)


class _CountingExpert(nn.Module):
    """An expert that records how many rows it saw in each call."""

    def __init__(self, ffn: nn.Module) -> None:
        super().__init__()
        self.ffn, self.calls = ffn, []

    def forward(self, x: Tensor) -> Tensor:
        self.calls.append(x.shape[0])
        return self.ffn(x)


def _diagnose_combine(got: Any, x: Tensor, combine: Tensor, experts: list[_CountingExpert]) -> list[str]:
    if not isinstance(got, Tensor) or tuple(got.shape) != tuple(x.shape):
        shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
        return [f"returned {shape}; return y with the shape of x, {tuple(x.shape)}"]
    got = got.detach()
    with torch.no_grad():
        outs = torch.stack([ex.ffn(x) for ex in experts], 1)  # (T, E, d)
    want = (combine.unsqueeze(-1) * outs).sum(1)
    problems = []
    if not torch.allclose(got, want, atol=1e-9, rtol=1e-9):
        if torch.allclose(got, ((combine > 0).double().unsqueeze(-1) * outs).sum(1), atol=1e-9):
            return ["the gate weights were not applied: multiply each expert's output by combine[t, e] "
                    "before adding it into y[t]"]
        if torch.allclose(got - x, want, atol=1e-9):
            return ["y already includes x: return only the experts' weighted sum; the residual x + MoE(x) is "
                    "added by the block around the layer"]
        if torch.allclose(got, outs.sum(1), atol=1e-9):
            return ["every expert's output was added for every token: weight by combine[t, e], which is 0 "
                    "for experts that were not chosen or were dropped"]
        return [f"y differs from sum_e combine[t, e] * experts[e](x[t]) by up to "
                f"{float((got - want).abs().max()):.3g}"]
    for e, ex in enumerate(experts):
        routed = int((combine[:, e] > 0).sum())
        if sum(ex.calls) > routed:
            problems.append(f"expert {e} ran on {sum(ex.calls)} rows but only {routed} tokens are routed "
                            "to it: dispatch only the tokens with a non-zero weight (that is what makes MoE "
                            "cheap)")
            break
        if len(ex.calls) > 1:
            problems.append(f"expert {e} was called {len(ex.calls)} times: gather its tokens and call it "
                            "once")
            break
    return problems


def check_dispatch_combine(fn: Callable[[Tensor, Tensor, list[nn.Module]], Tensor],
                           routings: Sequence[tuple[int, int, int, float]] = DISPATCH_ROUTINGS
                           ) -> CheckResult:
    """Run `fn(x, combine, experts) -> y` on routings with dropped tokens (each (T, E, k, capacity factor)
    of `routings`) and explain what is wrong."""
    if not callable(fn):
        raise ValueError(f"fn={fn!r} is not a function: pass your function itself, e.g. "
                         "check_dispatch_combine(my_dispatch_combine)")
    results = []
    for t, e, k, factor in routings:
        torch.manual_seed(t)
        experts = [_CountingExpert(ExpertFFN(6, 12).double()) for _ in range(e)]
        x = torch.randn(t, 6, dtype=torch.float64)
        logits = torch.randn(t, e, dtype=torch.float64) + torch.linspace(1.0, 0, e).double()
        combine = top_k_gating(logits, k, factor).combine_weights().detach()
        label = f"T={t}, E={e}, k={k}, capacity factor {factor:g}"
        try:
            lines = _diagnose_combine(fn(x.clone(), combine.clone(), list(experts)), x, combine, experts)
        except Exception as err:  # reported, not raised; the stub says "not written yet"
            lines = [NOT_WRITTEN] if is_stub(err) else [f"raised {type(err).__name__}: {err}"]
        results.append(CaseResult(label, not lines, lines))
    return CheckResult("check_dispatch_combine", results)


# --------------------------------------------------------------------------------------------------
# Exercise 3 (book): expert parallelism by hand
# --------------------------------------------------------------------------------------------------

def _expert_parallel_rank(fn: Callable[..., Any]) -> list[list[str]]:
    """On every rank: run fn(layer, x) -> y on two cases, compare y and the gradients with the reference."""
    import torch.distributed as dist

    from distlab import launch
    from distlab.moe import expert_parallel_diagnosis as diagnosis
    from distlab.moe.expert_parallel import ExpertParallelMoE

    r, p, dev = dist.get_rank(), dist.get_world_size(), launch.device()
    reports = []
    for k, factor, seed in ((1, 1.0, 0), (2, 0.75, 1)):
        ref = diagnosis.reference(p, k, factor, seed)
        a, b = ref.rows(r)
        # the reference runs on the CPU; the ranks' layer and rows on their device (a GPU under NCCL)
        with torch.device("cpu"):
            layer = ExpertParallelMoE.from_reference(ref.layer)
        layer = layer.to(dev)
        x_mine = ref.x[a:b].clone().to(dev).requires_grad_()
        y_dev = fn(layer, x_mine)
        y = y_dev.cpu() if isinstance(y_dev, torch.Tensor) else y_dev
        problems = diagnosis.output_problems(y, ref, r)
        reports.append(problems or diagnosis.gradient_problems(y_dev, x_mine, ref, r))
    return reports


def check_expert_parallel(fn: Callable[..., Any], world_sizes: tuple[int, ...] = (2, 4),
                          timeout: float = 20.0) -> CheckResult:
    """Run `fn(layer, x) -> y` (the forward pass of `ExpertParallelMoE` written by hand, using
    layer.router, layer.experts, layer.k, layer.capacity_factor, layer.experts_per_rank) on real ranks
    and compare outputs and input gradients with the single-process reference."""
    from distlab import launch

    if not callable(fn):
        raise ValueError(f"fn={fn!r} is not a function: pass your function itself, e.g. "
                         "check_expert_parallel(my_expert_parallel_forward)")
    results: list[CaseResult] = []
    for p in world_sizes:
        if results and results[-1].lines == [NOT_WRITTEN]:  # still the stub: no more launches
            results.append(not_written(f"{p} ranks"))
            continue
        try:
            per_rank = launch.run(_expert_parallel_rank, p, fn, timeout=timeout)
        except launch.RankError as err:
            if is_stub(err):
                results.append(not_written(f"{p} ranks"))
                continue
            first = str(err).splitlines()[0]
            results.append(CaseResult(f"{p} ranks", False, [first + " (a rank that fails or waits in a "
                                                            "collective stops the others too)"]))
            continue
        for c, label in enumerate(("k=1, capacity factor 1", "k=2, capacity factor 0.75")):
            lines = [line for rank in per_rank for line in rank[c]][:3]
            results.append(CaseResult(f"{p} ranks, {label}", not lines, lines))
    return CheckResult("check_expert_parallel", results)
