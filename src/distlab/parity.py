"""Parity: one way to say that a parallel run computed what a single process computes.

Every chapter checks its parallel version against a single-process reference on the same seed (outputs,
losses, gradients, updated weights). This module is the one vocabulary for that check:

- `TOLERANCE`, the largest absolute difference that is still rounding, by dtype, with its reason;
- `compare(ours, reference, dtype=...)`, which takes tensors, floats, sequences (a loss curve) and dicts of
  them (a state dict, named gradients), nested one level into families ("gradients": {name: tensor});
- `ParityReport`, the named differences it finds, with `passed`, `worst()` and `verdict()`, the sentence a
  lab prints ("logits, loss and all 38 gradients agree within 1e-10: ok"). The verdict never shows the
  differences themselves: they depend on the BLAS kernels and the thread count, the claim does not.

The parallel run adds the same terms as the reference in another order (per rank, then across ranks;
per microbatch, then over microbatches), so the two differ by rounding only: each addition is exact to a
relative unit roundoff u = 2^-(mantissa bits + 1), and a sum of n terms re-associated moves by at most
about n u times the size of its terms (Higham 2002, Accuracy and Stability of Numerical Algorithms, sec.
4.2). A real bug (a shard dropped, a missing division by p, a stale gradient) moves results by 1e-3 or
more. Each tolerance sits orders of magnitude above the first and below the second, for values of size
about 1 after a few steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-10,  # u = 1.1e-16: re-associated sums differ by ~1e-14; 1e4 times that is rounding
    torch.float32: 1e-5,  # u = 6.0e-8: differences seen are ~1e-7 after a few steps; a hundred times that
    torch.float16: 1e-2,  # u = 4.9e-4 (10 mantissa bits): ~20 ulps at size 1, a few sums of ~10 terms
    torch.bfloat16: 5e-2,  # u = 3.9e-3 (7 mantissa bits): ~13 ulps at size 1 (float32's range, few digits)
}

Value = Tensor | float | int | Sequence | Mapping


@dataclass
class ParityReport:
    """The largest absolute difference of each compared quantity, and the tolerance they are held to.

    `differences` maps a family ("logits", "loss", "gradients") to its members' differences; a single
    tensor or number is a family of one, named like it. A difference is `nan` when either side has a nan
    where the other does not (and the report then fails).
    """

    differences: dict[str, dict[str, float]]
    tolerance: float
    dtype: torch.dtype | None = None
    label: str = ""
    extra: list[str] = field(default_factory=list)  # further claims that failed, e.g. "routing"
    against: str = ""  # what the reference is, in words ("one process"), for the verdict

    @property
    def passed(self) -> bool:
        """Every difference within the tolerance (False for a nan) and no extra failure."""
        return not self.extra and all(d <= self.tolerance for fam in self.differences.values()
                                      for d in fam.values())

    def __bool__(self) -> bool:
        return self.passed

    def worst(self) -> float:
        """The largest difference of all (nan if any is nan; 0.0 when nothing was compared)."""
        diffs = [d for fam in self.differences.values() for d in fam.values()]
        return math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)

    def worst_name(self) -> str:
        """The name of the largest difference (a nan counts as largest). Machine-dependent among near-ties:
        use it in an error message, never in a lab's compared output."""
        flat = self.flat()
        if not flat:
            raise ValueError("the report is empty: nothing was compared")
        return max(flat, key=lambda n: math.inf if math.isnan(flat[n]) else flat[n])

    def flat(self) -> dict[str, float]:
        """Every difference by full name: `family` for a single value, `family[member]` in a family."""
        return {_full_name(fam, member): d for fam, members in self.differences.items()
                for member, d in members.items()}

    def failures(self) -> list[str]:
        """The names of what is beyond the tolerance (or nan), in the order compared, extras first."""
        return self.extra + [n for n, d in self.flat().items() if not d <= self.tolerance]

    def subject(self) -> str:
        """What was compared, in words: "logits, loss and all 38 gradients"."""
        parts = [fam if set(members) == {fam} else f"all {len(members)} {fam}" if len(members) > 1
                 else f"{fam} ({next(iter(members))})" for fam, members in self.differences.items()]
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]

    def _agree(self) -> str:
        one = len(self.differences) == 1 and all(set(m) == {f} for f, m in self.differences.items())
        return "agrees" if one and not next(iter(self.differences)).endswith("s") else "agree"

    def verdict(self) -> str:
        """One line that is the same on every machine: the claim, and ok or the names of what failed."""
        head = f"{self.label}: " if self.label else ""
        head += f"{self.subject()} {self._agree()}{' with ' + self.against if self.against else ''}"
        head += f" within {self.tolerance:g}"
        if self.passed:
            return head + ": ok"
        bad = self.failures()
        return f"{head}: FAILED for {', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}"

    def __str__(self) -> str:
        """The magnitudes (they differ from machine to machine: print `verdict()` in a lab)."""
        head = f"{self.label}: " if self.label else ""
        if not self.differences:
            return head + "nothing compared"
        return (f"{head}max |diff| {self.worst():.2e} at {self.worst_name()} (tolerance {self.tolerance:g}"
                f"{', ' + str(self.dtype).removeprefix('torch.') if self.dtype else ''})")

    def assert_passed(self) -> ParityReport:
        """Raise an AssertionError naming what differs most, and by how much, unless the report passed."""
        if not self.passed:
            raise AssertionError(f"{self} - {self.verdict()}")
        return self


def merge(reports: Iterable[ParityReport], label: str | None = None) -> ParityReport:
    """One report for several (one per rank, say): the largest difference of each name over all of them.
    They must have compared the same names against the same tolerance."""
    reports = list(reports)
    if not reports:
        raise ValueError("reports is empty; pass at least one ParityReport (one per rank)")
    first = reports[0]
    for r in reports[1:]:
        if r.tolerance != first.tolerance or r.flat().keys() != first.flat().keys():
            raise ValueError(f"the reports compared different things ({r.subject()} within {r.tolerance:g} "
                             f"against {first.subject()} within {first.tolerance:g}); merge like reports")
    diffs = {fam: {m: _max_nan(r.differences[fam][m] for r in reports) for m in members}
             for fam, members in first.differences.items()}
    extra = list(dict.fromkeys(e for r in reports for e in r.extra))
    return ParityReport(diffs, first.tolerance, first.dtype, first.label if label is None else label, extra,
                        first.against)


def compare(ours: Value, reference: Value, *, dtype: torch.dtype | None = None, tol: float | None = None,
            name: str | None = None, label: str = "", against: str = "", equal_nan: bool = False
            ) -> ParityReport:
    """The largest absolute difference of every quantity in `ours` from the same one in `reference`.

    ours, reference: a tensor, a number, a sequence (a loss curve), or a dict of these (top-level keys
        name families: {"logits": t, "gradients": {name: t}}); both must have the same keys and shapes.
    dtype: picks the tolerance from `TOLERANCE`; by default the lowest precision among `ours`'s tensors.
    tol: a tolerance that replaces the table's (say why where you pass one).
    name: the family name of `ours` ("loss", "losses"; "output" by default). Given with a dict, the dict
        is one family of that name (a state dict: name="parameters"); without, its keys are families.
    label: what ran, printed first in the verdict ("tp=2 float64"); against: what the reference is, in
        words ("one process"), for the verdict.
    equal_nan: a nan on both sides at the same place counts as agreement (a loss over targets that are all
        ignored is nan in both models); otherwise any nan fails.
    """
    if dtype is None:
        dtype = _lowest_precision(ours)
    if tol is None:
        if dtype is None:
            raise ValueError("compare(..., dtype=None) found no floating-point tensor to take the dtype "
                             "from; pass dtype= (e.g. torch.float32) or tol=")
        if dtype not in TOLERANCE:
            raise ValueError(f"dtype={dtype} has no tolerance in distlab.parity.TOLERANCE "
                             f"({', '.join(str(d) for d in TOLERANCE)}); pass tol= and say why")
        tol = TOLERANCE[dtype]
    if isinstance(ours, Mapping) and name is None:
        _same_keys(ours, reference, "")
        families = {str(k): _family(str(k), ours[k], reference[k], equal_nan) for k in ours}
    else:
        name = name or "output"
        families = {name: _family(name, ours, reference, equal_nan)}
    return ParityReport(families, tol, dtype, label, against=against)


def _family(name: str, ours: Value, ref: Value, equal_nan: bool) -> dict[str, float]:
    """A family's members: {name: diff} for a single value, {member: diff} for a dict or a sequence."""
    if isinstance(ours, Mapping):
        _same_keys(ours, ref, name)
        return {str(k): d for k in ours for k, d in _leaves(f"{k}", ours[k], ref[k], name, equal_nan)}
    if _is_sequence(ours):
        if not _is_sequence(ref) or len(ours) != len(ref):
            raise ValueError(f"{name}: {_describe(ours)} here but {_describe(ref)} in the reference; compare "
                             "sequences of the same length (the same steps)")
        pairs = enumerate(zip(ours, ref, strict=True))
        return {str(i): _difference(f"{name}[{i}]", a, b, equal_nan) for i, (a, b) in pairs}
    return {name: _difference(name, ours, ref, equal_nan)}


def _leaves(key: str, ours: Value, ref: Value, where: str, equal_nan: bool) -> Iterable[tuple[str, float]]:
    """(member name, difference) for a member that may itself be nested (its names joined with '.')."""
    if isinstance(ours, Mapping):
        _same_keys(ours, ref, _full_name(where, key))
        for k in ours:
            yield from _leaves(f"{key}.{k}", ours[k], ref[k], where, equal_nan)
    else:
        yield key, _difference(_full_name(where, key), ours, ref, equal_nan)


def _difference(where: str, a: Tensor | float, b: Tensor | float, equal_nan: bool) -> float:
    """max |a - b| in float64 on the CPU; nan if a nan stands where the other side has none."""
    if isinstance(a, Mapping) or isinstance(b, Mapping) or _is_sequence(a) or _is_sequence(b):
        raise ValueError(f"{where}: {_describe(a)} here but {_describe(b)} in the reference; compare a "
                         "tensor or number with the same kind of value")
    ta, tb = (torch.as_tensor(x).detach().to("cpu", torch.float64) for x in (a, b))
    if ta.shape != tb.shape:
        raise ValueError(f"{where}: shape {tuple(ta.shape)} here but {tuple(tb.shape)} in the reference; "
                         "compare the same tensor (gather the shards, or shard the reference)")
    if ta.numel() == 0:
        return 0.0
    diff = (ta - tb).abs()
    if equal_nan:
        diff = diff.masked_fill(ta.isnan() & tb.isnan(), 0.0)
    return float(diff.max())  # torch's max propagates a nan


def _same_keys(ours: Mapping, ref: Value, where: str) -> None:
    at = f"{where}: " if where else ""
    if not isinstance(ref, Mapping):
        raise ValueError(f"{at}a dict here but {_describe(ref)} in the reference; compare like with like")
    missing, extra = [k for k in ref if k not in ours], [k for k in ours if k not in ref]
    if missing or extra:
        raise ValueError(f"{at}the keys differ: missing here {sorted(map(str, missing))}, not in the "
                         f"reference {sorted(map(str, extra))}; compare the same names (gather every rank's "
                         "part)")


def _lowest_precision(value: Value) -> torch.dtype | None:
    dtypes = {t.dtype for t in _tensors(value) if t.is_floating_point()}
    return max(dtypes, key=lambda d: torch.finfo(d).eps) if dtypes else None


def _tensors(value: Value) -> Iterable[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors(v)
    elif _is_sequence(value):
        for v in value:
            yield from _tensors(v)


def _is_sequence(x: object) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes))


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if _is_sequence(x):
        return f"a sequence of {len(x)}"
    return f"a {type(x).__name__}"


def _full_name(family: str, member: str) -> str:
    return family if not family or member == family else f"{family}[{member}]"


def _max_nan(values: Iterable[float]) -> float:
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values)
