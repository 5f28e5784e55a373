"""Inside a rank: run a student's all-reduce on inputs built to be decoded, and say what is wrong.

`check_ring_all_reduce(my_ring_all_reduce)` (in `exercises.py`) runs the function on 1, 2, 3 and 4
ranks, on several element counts -- 1 element, counts that p divides and counts it does not -- and on
every rank `_run_cases` compares the tensor with `dist.all_reduce` of the same inputs. When they differ,
`_diagnose` decodes the wrong values, because the inputs are built to be decoded: rank r's element i is

    x_r[i] = B**r + B**p * (i + 1)        (B = 8 up to 5 ranks, else 4: exact in float32)

so a sum that counts rank q's data c_q times at position i is sum_q c_q B**q + B**p (i + 1) sum_q c_q.
The base-B digits say whose data a value holds and how often, and the high part says whether it came
from the right position. From that the check names the rank, the chunk (as in `chunk_bounds(n, p)`)
and the likely mistake: a chunk never reduced, a chunk added twice, a missing all-gather, chunk offsets
that differ, a result not written in place, a missing `return`, or a send with no matching recv.
`check_two_level_all_reduce` does the same for `fn(tensor, node, across)` on several node layouts: the
ranks are laid out as `distlab.mesh.grid(dp=nodes, tp=ranks_per_node)`, `node` is this rank's "tp" group
(the ranks of its node) and `across` its "dp" group (the ranks with the same place on every node, which
for a node's first rank are the leaders of all nodes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from distlab.collectives.ring import chunk_bounds

MAX_RANKS = 8  # 4**8 * 8 * 31 < 2**24 and 8**5 * 5 * 31 < 2**24: sums of up to MAX_COUNT elements
MAX_COUNT = 30  # on up to MAX_RANKS ranks are exact in float32


def encoded_input(rank: int, p: int, n: int, device: Any = "cpu"):  # -> torch.Tensor
    """Rank `rank`'s test input of n float32 elements on `device`: element i is B**rank + B**p * (i + 1),
    B = base(p)."""
    import torch

    b = base(p)
    return (b**rank + b**p * torch.arange(1, n + 1, dtype=torch.float64, device=device)).float()


def default_counts(p: int) -> list[int]:
    """Element counts tried on p ranks: 1, 2p (divisible by p) and p + 1, 3p + 2 (not, for p > 2)."""
    return sorted({1, p + 1, 2 * p, 3 * p + 2})


def base(p: int) -> int:
    """Digit base of the inputs on p ranks: 8 up to 5 ranks, else 4 (so sums stay exact in float32)."""
    return 8 if p <= 5 else 4


def _signature(got: float, want: float, i: int, rank: int, p: int) -> tuple:
    """What element i holds: ("ok",), ("own",), ("zero",), ("nan",), ("odd",), ("shift",), ("excess",),
    ("times", m), ("divided", m) or ("mix", counts), counts[q] = how often rank q's data was added."""
    if got == want:
        return ("ok",)
    if not math.isfinite(got):
        return ("nan",)
    if got == 0:
        return ("zero",)
    digits = _decode(got, i, rank, p) if got > 0 and got == round(got) else None
    if digits is not None:
        return digits
    return _ratio_signature(got, want)


def _decode(got: float, i: int, rank: int, p: int) -> tuple | None:
    """Read a whole positive value as base-B digits (whose data, how often) and a high part (which
    position): ("own",), ("times", m), ("mix", counts) or ("shift",); None if the digits explain nothing."""
    b = base(p)
    high, low = divmod(int(got), b**p)
    counts = tuple((low // b**q) % b for q in range(p))
    if high == (i + 1) * sum(counts):  # whole contributions, all from position i
        if counts == tuple(int(q == rank) for q in range(p)):
            return ("own",)
        return ("times", counts[0]) if len(set(counts)) == 1 else ("mix", counts)
    if sum(counts) and high % sum(counts) == 0 and high // sum(counts) <= 2 * MAX_COUNT:
        return ("shift",)  # whole contributions, from another position
    return None


def _ratio_signature(got: float, want: float) -> tuple:
    """A value the digits do not explain: a whole multiple or fraction of the sum, more, or neither."""
    if want / got == round(want / got) > 1:
        return ("divided", round(want / got))
    if got / want == round(got / want) > 1:
        return ("times", round(got / want))
    return ("excess",) if got == round(got) and got > want else ("odd",)


def _where(a: int, b: int, n: int, parts: int | None) -> str:
    if parts is not None:
        for k, (lo, hi) in enumerate(chunk_bounds(n, parts)):
            if (a, b) == (lo, hi):
                return f"chunk {k} (elements {a}:{b})"
            if lo <= a and b <= hi:
                return f"elements {a}:{b} of chunk {k}"
    return "the whole tensor" if (a, b) == (0, n) and parts is None else f"elements {a}:{b}"


def _two_level_hint(rank: int, present: list[int], p: int, ranks_per_node: int) -> str:
    node = [q for q in range(p) if q // ranks_per_node == rank // ranks_per_node]
    same_local = [q for q in range(p) if q % ranks_per_node == rank % ranks_per_node]
    if present == node and len(node) < p:
        return f": it holds only node {rank // ranks_per_node}'s sum, so the inter-node phase is missing " \
               "or its result never reached this rank"
    if present == same_local and len(same_local) < p:
        return ": it holds only the ranks with the same local index, so the intra-node phase is missing"
    return ""


# What a signature of one kind says, with {at} (the place), {got} and {want} (the values), {m} (a factor).
_STORIES = {
    "zero": ("{at} is all zeros: what was received never reached the tensor (receive into the tensor's "
             "slice, or add/copy the receive buffer back into it)"),
    "nan": ("{at} holds NaN or inf: a buffer from torch.empty was used before anything was received into "
            "it"),
    "odd": ("{at} holds {got:g} where {want:g} was expected, which no sum of the inputs explains: was "
            "something subtracted or divided, or read from an uninitialised buffer (torch.empty)?"),
    "excess": ("{at} holds more than the full sum ({got:g} where {want:g} was expected): some rank's data "
               "was added more than once, so a chunk was added twice"),
    "shift": ("{at} holds data from other positions: sender and receiver disagree on where a chunk starts "
              "or ends (use chunk_bounds(n, p) on every rank, and send and receive the same chunk)"),
    "divided": ("{at}: values are {m} times too small: the sum was divided by {m} (all-reduce with SUM "
                "adds; average only if asked to)"),
}


def _explain(sig: tuple, where: str, rank: int, p: int, got: float, want: float,
             ranks_per_node: int | None) -> str:
    at = f"{where} on rank {rank}"
    kind = sig[0]
    if kind in _STORIES:
        return _STORIES[kind].format(at=at, got=got, want=want, m=sig[1] if len(sig) > 1 else None)
    if kind == "own":
        what = "that chunk was" if where.startswith("chunk") else "those elements were"
        return f"{at} equals rank {rank}'s own input: {what} never reduced"
    if kind == "times":
        m = sig[1]
        return (f"{at}: values are {'p = ' if m == p else ''}{m} times too large: every rank's data was "
                f"added {m} times, so a chunk was added twice (did an all-gather step add instead of copy?)")
    return _explain_mix(sig[1], at, rank, p, ranks_per_node)


def _explain_mix(counts: tuple, at: str, rank: int, p: int, ranks_per_node: int | None) -> str:
    """A sum of some ranks' data, some of it more than once: which ranks are doubled, which missing."""
    present = [q for q in range(p) if counts[q]]
    twice = [q for q in range(p) if counts[q] > 1]
    missing = [q for q in range(p) if not counts[q]]
    parts = []
    if twice:
        parts.append(f"counts the data of rank(s) {twice} more than once (up to {max(counts)} times): a "
                     "chunk was added twice")
    if missing:
        hint = _two_level_hint(rank, present, p, ranks_per_node) if ranks_per_node else ""
        parts.append(f"is missing the data of rank(s) {missing} (it sums ranks {present} only){hint}")
    return f"{at} " + "; and it ".join(parts)


def _returned(rank: int, p: int, original, got, returned: Any) -> tuple[list[str], Any, bool]:
    """What the function handed back: the problems with it, the tensor to explain (the one it computed),
    and whether to stop there (a result of the wrong shape cannot be compared)."""
    import torch

    if returned is None:
        return [f"the function returned None on rank {rank}: return the tensor (`return tensor`)"], got, False
    if not isinstance(returned, torch.Tensor):
        return [f"the function returned a {type(returned).__name__} on rank {rank}: return the "
                "tensor"], got, False
    if returned is got or not torch.equal(got, original) or p == 1:
        return [], got, False
    if tuple(returned.shape) != tuple(got.shape):
        return [f"the function returned shape {tuple(returned.shape)} on rank {rank}, but the input has "
                f"shape {tuple(got.shape)}: all-reduce keeps the shape"], returned, True
    return [f"the input was not modified in place on rank {rank}: the function returned a new tensor, but "
            "all-reduce must write the sum into the tensor it was given (e.g. tensor.copy_(result), or work "
            "on slices of tensor)"], returned, False  # explain what it computed, and that it was not written


def _runs(sigs: list[tuple], chunks: list[tuple[int, int]]) -> list[tuple[tuple, int, int]]:
    """Consecutive elements with the same story, as (signature, start, end); never across chunks."""
    runs: list[tuple[tuple, int, int]] = []
    for i, sig in enumerate(sigs):
        new_chunk = any(lo == i for lo, _ in chunks)
        if runs and runs[-1][0] == sig and not new_chunk:
            runs[-1] = (sig, runs[-1][1], i + 1)
        else:
            runs.append((sig, i, i + 1))
    return runs


def _right_chunks(sigs: list[tuple], chunks: list[tuple[int, int]]) -> list[int]:
    """The chunks (non-empty) whose every element holds the right sum."""
    return [k for k, (lo, hi) in enumerate(chunks) if hi > lo and all(s == ("ok",) for s in sigs[lo:hi])]


def _partial_sum(sig: tuple) -> bool:
    """Whether a wrong element holds part of the sum, no rank more than once."""
    return sig[0] == "own" or (sig[0] == "mix" and max(sig[1]) == 1)


def _one_rank(sig: tuple) -> bool:
    """Whether a wrong element holds one rank's data only."""
    return sig[0] == "own" or sum(sig[1]) == 1


def _phase_missing(sigs: list[tuple], wrong: list, chunks: list[tuple[int, int]], rank: int) -> list[str]:
    """When data is missing and nothing doubled: the phase of the ring that did not run, if it shows."""
    right = _right_chunks(sigs, chunks)
    partial = [s for s, _, _ in wrong if _partial_sum(s)]
    if len(partial) != len(wrong):
        return []
    if len(right) == 1:
        return [f"only chunk {right[0]} is correct on rank {rank}: did the all-gather phase run?"]
    if all(_one_rank(s) for s in partial):
        return [f"every wrong chunk on rank {rank} holds one rank's data only: the all-gather spread chunks "
                "that were never reduced (does the reduce-scatter run p - 1 steps, and does the all-gather "
                "start from the chunk this rank finished reducing?)"]
    return []


def _diagnose(rank: int, p: int, n: int, original, got, expected, returned: Any,
              ranks_per_node: int | None) -> list[str]:
    """Every problem with this rank's result, most telling first; [] when it is right."""
    problems, target, stop = _returned(rank, p, original, got, returned)
    if stop:
        return problems
    values = target.double().reshape(-1).tolist()
    want = expected.double().reshape(-1).tolist()
    sigs = [_signature(v, w, i, rank, p) for i, (v, w) in enumerate(zip(values, want, strict=True))]
    if all(s == ("own",) for s in sigs) and p > 1:
        return problems + [f"the tensor on rank {rank} is unchanged (it still equals rank {rank}'s own "
                           "input): nothing was reduced into it"]
    return problems + _element_problems(sigs, values, want, n, rank, p, ranks_per_node)


def _element_problems(sigs: list[tuple], values: list[float], want: list[float], n: int, rank: int, p: int,
                      ranks_per_node: int | None) -> list[str]:
    """The problems the elements show: the ring phase that did not run (if it shows), then each wrong run."""
    parts = p if ranks_per_node is None else None
    chunks = chunk_bounds(n, parts) if parts else [(0, n)]
    wrong = [(s, a, b) for s, a, b in _runs(sigs, chunks) if s != ("ok",)]
    phase = _phase_missing(sigs, wrong, chunks, rank) if parts and wrong and n >= p > 1 else []
    return phase + _details(wrong, values, want, n, parts, rank, p, ranks_per_node)


def _details(wrong: list, values: list[float], want: list[float], n: int, parts: int | None, rank: int,
             p: int, ranks_per_node: int | None) -> list[str]:
    """The story of each wrong run of elements, the first two of them (one when all tell the same)."""
    if len({s for s, _, _ in wrong}) == 1 and sum(b - a for _, a, b in wrong) == n and n > 1:
        wrong = [(wrong[0][0], 0, n)]  # one story for the whole tensor: tell it once
    details = [_explain(s, "the whole tensor" if (a, b) == (0, n) and n > 1 else _where(a, b, n, parts),
                        rank, p, values[a], want[a], ranks_per_node) for s, a, b in wrong]
    more = [f"(and {len(details) - 2} more wrong parts on rank {rank})"] if len(details) > 2 else []
    return details[:2] + more


def own_messages_device(device: Any, backend: str) -> Any:  # torch.device -> torch.device
    """Where the tensors go that a student's own `dist.isend`/`dist.recv` carry: the rank's `device`,
    except for a GPU on gloo (ranks sharing a GPU, DISTLAB_DEVICE=cuda): gloo's send and recv take host
    memory only, so there the CPU (the course's own messages stage instead: `distlab.staged_p2p`)."""
    import torch

    from distlab.staged_p2p import needs_staging

    return torch.device("cpu") if needs_staging(device, backend) else device


def _run_cases(fn: Callable[..., Any], counts: Sequence[int], ranks_per_node: int | None) -> list[list[str]]:
    """Body of every rank: the student's function on each element count; this rank's problems per count.

    With ranks_per_node, fn(tensor, node, across) gets the groups of a mesh grid(dp=p // ranks_per_node,
    tp=ranks_per_node), made once here: node = its "tp" group, across = its "dp" group. Without it, fn is
    the ring exercise, which sends and receives with dist.isend/dist.recv itself (`own_messages_device`).
    """
    import torch.distributed as dist

    from distlab import launch, mesh

    rank, p, dev = dist.get_rank(), dist.get_world_size(), launch.device()
    if ranks_per_node is None:
        dev = own_messages_device(dev, dist.get_backend())
    groups = ()
    if ranks_per_node is not None:
        grid = mesh.grid(dp=p // ranks_per_node, tp=ranks_per_node)
        groups = (grid["tp"].get_group(), grid["dp"].get_group())
    out = []
    for n in counts:
        tensor = encoded_input(rank, p, n, dev)  # on the rank's device: NCCL takes only its GPU's tensors
        original, expected = tensor.clone(), tensor.clone()
        dist.all_reduce(expected)
        returned = fn(tensor, *groups)
        out.append(_diagnose(rank, p, n, original, tensor, expected, returned, ranks_per_node))
        dist.barrier()  # keep the cases apart, whatever the function left in flight
    return out
