"""Checks for chapter 1's exercises: run the student's all-reduce on real ranks and say what is wrong.

`check_ring_all_reduce(fn)` runs the function on 1, 2, 3 and 4 ranks (one launch per world size) and
`check_two_level_all_reduce(fn)` on several node layouts, each on several element counts, and compare
every rank's tensor with `dist.all_reduce`. What each rank's wrong values mean is worked out inside the
rank by `all_reduce_diagnosis.py` (inputs built to be decoded); here the ranks' findings are folded into
one readable `CheckResult` (`distlab.checks`), and a hang or an exception is explained too. The student
version's stub (it raises NotImplementedError) is reported as "not written yet" after one launch: the
other world sizes would say the same, so they are not started.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Sequence
from typing import Any

from distlab.checks import NOT_WRITTEN, CaseResult, CheckResult, is_stub, not_written
from distlab.collectives.all_reduce_diagnosis import MAX_COUNT, MAX_RANKS, _run_cases, default_counts
from distlab.collectives.ring import chunk_bounds

# gloo's own complaint when a message is longer than the buffer posted for it (it then aborts the rank):
# "op.preamble.length <= op.nbytes. 4 vs 0. Received data size doesn't match expected size."
_GLOO_SIZE = re.compile(r"\[rank (\d+)\].*?(\d+) vs (\d+)\. Received data size doesn't match expected size")
# What gloo and the C++ runtime print around such an abort, and the peers' broken connections after it:
# noise for the student, who gets one sentence instead.
_GLOO_NOISE = re.compile(r"terminate called|what\(\):|EnforceNotMet|Connection reset by peer|GLHF|"
                         r"Connection closed by peer|Exception raised from|frame #\d+|gloo/transport|"
                         r"Received data size|ProcessGroupGloo|\[enforce fail")
ELEMENT_BYTES = 4  # the check's inputs are float32 (all_reduce_diagnosis)


def _summarise(label: str, counts: Sequence[int], per_rank: list[list[list[str]]], p: int) -> CaseResult:
    """Fold every rank's problems into the lines of one case: the first failing count in detail."""
    failing = [j for j in range(len(counts)) if any(rank[j] for rank in per_rank)]
    if not failing:
        return CaseResult(label, True)
    j = max(failing, key=lambda k: counts[k])  # the most elements per chunk tell the clearest story
    lines = [f"with n = {counts[j]} elements:"] + _wrong_ranks([rank[j] for rank in per_rank], p)
    return CaseResult(label, False, lines + _other_counts(counts, failing, j, p))


def _other_counts(counts: Sequence[int], failing: list[int], shown: int, p: int) -> list[str]:
    """The lines after the detailed count: the other wrong counts, the right ones, and their pattern."""
    lines = []
    if len(failing) > 1:
        lines.append(f"also wrong for n = {[counts[k] for k in failing if k != shown]}")
    passing = [n for k, n in enumerate(counts) if k not in failing]
    if passing:
        lines.append(f"right for n = {passing}")
        lines += _size_pattern([counts[k] for k in failing], passing, p)
    return lines


def _wrong_ranks(problems: list[list[str]], p: int) -> list[str]:
    """The lines about one element count, from each rank's problems with it: the first wrong rank in
    full, then up to two ranks whose headline tells a different story, then which ranks are wrong."""
    bad_ranks = [r for r in range(p) if problems[r]]
    first = bad_ranks[0]
    lines = [f"  {msg}" for msg in problems[first]]

    def gist(r: int) -> list[str]:
        return [msg.replace(f"rank {r}", "rank #") for msg in problems[r]]

    heads = [gist(first)[0]]
    for r in bad_ranks[1:]:
        if gist(r)[0] not in heads and len(heads) < 3:
            heads.append(gist(r)[0])
            lines.append(f"  {problems[r][0]}")
    if len(bad_ranks) > 1:
        how = ", in the same way" if all(gist(r) == gist(first) for r in bad_ranks) else ""
        lines.append(f"  ({'all ' if len(bad_ranks) == p else ''}ranks {bad_ranks} are wrong{how})")
    return lines


def _size_pattern(bad_n: list[int], passing: list[int], p: int) -> list[str]:
    """A hint when the wrong counts share a size pattern: p does not divide them, or they are below p."""
    if p > 1 and all(n % p for n in bad_n) and any(n % p == 0 for n in passing):
        return [f"it fails only when p = {p} does not divide n: chunks differ in size then; take "
                "every chunk's bounds from chunk_bounds(n, p), on the sender and the receiver alike"]
    if p > 1 and all(n < p for n in bad_n):
        return [f"it fails only when n < p = {p}, where some chunks are empty: send and receive "
                "empty chunks consistently (or skip them on both sides)"]
    return []


def _size_mismatch(output: str, p: int, counts: Sequence[int]) -> list[str] | None:
    """The explanation of gloo's "Received data size doesn't match expected size", or None."""
    m = _GLOO_SIZE.search(output)
    if m is None:
        return None
    rank, got, want = int(m[1]), int(m[2]) // ELEMENT_BYTES, int(m[3]) // ELEMENT_BYTES
    lines = [f"rank {rank} received a message of {got} element(s) into a recv buffer of {want}: the sender "
             "and the receiver used different chunks, and gloo stopped the rank"]
    for n in counts:
        sizes = [b - a for a, b in chunk_bounds(n, p)]
        if got in sizes and want in sizes and got != want:
            sent = [i for i, size in enumerate(sizes) if size == got]
            posted = [i for i, size in enumerate(sizes) if size == want]
            lines.append(f"with n = {n} on p = {p} the chunks hold {sizes} elements: the message was chunk "
                         f"{_either(sent)}, the buffer chunk {_either(posted)}")
            break
    lines.append("at step s a rank sends chunk (r - s) % p and receives into chunk (r - s - 1) % p (in the "
                 "all-gather phase one further on): compute both from the same formula, with r its own rank, "
                 "so that what rank r - 1 sends is what rank r expects")
    return lines


def _either(indices: list[int]) -> str:
    return str(indices[0]) if len(indices) == 1 else " or ".join(map(str, indices))


def _quiet(output: str) -> str:
    """The ranks' output without gloo's abort messages (the student's own prints stay)."""
    return "\n".join(line for line in output.splitlines() if not _GLOO_NOISE.search(line))


def _from_error(label: str, err: Exception) -> CaseResult:
    """Turn a failed launch into an explanation: a hang (timeout) or an exception in the function."""
    text = str(err)
    rank = getattr(err, "rank", "?")
    if "timed out" in text.lower() or "timeout" in text.lower():
        lines = [f"rank {rank} waited for a message that never came (it timed out): check that every send "
                 "has a matching recv on the peer it names, of the same size, and that every rank runs "
                 "the same number of steps"]
        if "deadlock" in text.lower():
            lines.append("every rank was waiting at once: a deadlock (e.g. all ranks in a blocking recv "
                         "before anyone sends; post sends with isend, or alternate the order)")
        return CaseResult(label, False, lines)
    tb = (getattr(err, "traceback", "") or text).strip().splitlines()
    last = tb[-1] if tb else type(err).__name__
    lines = [f"rank {rank} raised an exception: {last}"]
    if "size" in last.lower() or "mismatch" in last.lower():
        lines.append("a recv buffer must have the same number of elements and dtype as the matching send")
    return CaseResult(label, False, lines)


def _check(exercise: str, fn: Callable[..., Any], runs: list[tuple[str, int, int | None]],
           counts: Sequence[int] | None, timeout: float, progress: bool) -> CheckResult:
    from tqdm.auto import tqdm

    from distlab import launch

    if not callable(fn):
        raise ValueError(f"fn={fn!r} is not a function: pass your function itself, e.g. "
                         f"{exercise}(my_function) -- without calling it")
    cases: list[CaseResult] = []
    for label, p, ranks_per_node in tqdm(runs, desc=exercise, disable=not progress, leave=False):
        tried = _counts(counts, p)
        if cases and cases[-1].lines == [NOT_WRITTEN]:  # still the stub: no more launches
            cases.append(not_written(label))
            continue
        output = io.StringIO()  # what the ranks print; gloo's abort noise is dropped from it below
        try:
            with contextlib.redirect_stdout(output):
                per_rank = launch.run(_run_cases, p, fn, tried, ranks_per_node, timeout=timeout)
        except launch.RankError as err:
            mismatch = _size_mismatch(output.getvalue(), p, tried)
            cases.append(not_written(label) if is_stub(err) else CaseResult(label, False, mismatch)
                         if mismatch else _from_error(label, err))
            continue
        finally:
            if _quiet(output.getvalue()):
                print(_quiet(output.getvalue()))
        cases.append(_summarise(label, tried, per_rank, p))
    return CheckResult(exercise, cases)


def _counts(counts: Sequence[int] | None, p: int) -> list[int]:
    """The element counts to try on p ranks: `counts`, checked, or `default_counts(p)`."""
    tried = list(counts) if counts is not None else default_counts(p)
    if any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_COUNT for n in tried):
        raise ValueError(f"counts={tried} must be element counts from 1 to {MAX_COUNT} (so that every "
                         "value stays exact in float32), e.g. counts=(1, 5, 8)")
    return tried


def _sizes(values: Sequence[int], name: str) -> list[int]:
    if any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_RANKS for v in values):
        raise ValueError(f"{name}={tuple(values)} must hold whole numbers from 1 to {MAX_RANKS}, "
                         f"e.g. {name}=(1, 2, 3, 4)")
    return list(values)


def check_ring_all_reduce(fn: Callable[..., Any], world_sizes: Sequence[int] = (1, 2, 3, 4),
                          counts: Sequence[int] | None = None, timeout: float = 10.0,
                          progress: bool = True) -> CheckResult:
    """Run `fn(tensor)` (an in-place sum all-reduce that returns `tensor`) on each world size and explain
    any difference from dist.all_reduce. `counts`: element counts to try (default `default_counts(p)`);
    `timeout`: seconds a rank may wait for one message before the check calls it a hang."""
    runs = [(f"{p} rank{'s' if p > 1 else ''}", p, None) for p in _sizes(world_sizes, "world_sizes")]
    return _check("check_ring_all_reduce", fn, runs, counts, timeout, progress)


def check_two_level_all_reduce(fn: Callable[..., Any],
                               layouts: Sequence[tuple[int, int]] = ((2, 2), (1, 3), (3, 1)),
                               counts: Sequence[int] | None = None, timeout: float = 10.0,
                               progress: bool = True) -> CheckResult:
    """Run `fn(tensor, node, across)` (an in-place sum all-reduce that returns `tensor`) on each
    (nodes, ranks_per_node) layout, and explain any difference from dist.all_reduce, naming the phase
    that looks missing when the values point to one.

    The ranks form the mesh `distlab.mesh.grid(dp=nodes, tp=ranks_per_node)`: ranks
    node * ranks_per_node .. (node + 1) * ranks_per_node - 1 share a node. `node` is the rank's "tp"
    group (its node; group rank 0 leads it) and `across` its "dp" group (one rank per node, at the same
    place in each; on a leader, the group of all leaders)."""
    runs = []
    for layout in layouts:
        if not (isinstance(layout, tuple) and len(layout) == 2):
            raise ValueError(f"layouts must be (nodes, ranks_per_node) pairs, e.g. ((2, 2), (1, 3)); "
                             f"got {layout!r}")
        nodes, per_node = _sizes(layout, "layout")
        _sizes([nodes * per_node], "nodes * ranks_per_node")
        runs.append((f"{nodes} node{'s' if nodes > 1 else ''} x {per_node} rank{'s' if per_node > 1 else ''}",
                     nodes * per_node, per_node))
    return _check("check_two_level_all_reduce", fn, runs, counts, timeout, progress)
