"""Checks for chapter 8's exercises: they say which unit or factor mistake an answer contains.

The mistakes that hardware arithmetic invites are few and each multiplies the answer by a known factor:
- a vendor's bidirectional figure used as if it were one direction (bandwidth x2, so time /2);
- gigabits per second used as gigabytes per second (bandwidth x8: 1 byte = 8 bits);
- the ring's 2(p-1)/p factor left out (each rank sends and receives 2(p-1)/p n bytes, Patarasuk & Yuan 2009);
- in a two-level ring, all n bytes sent across the network instead of the n/m each NIC carries.
A check recomputes the answer with every combination of these mistakes and names the combination the
student's number matches, with the fix.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from distlab import catalog
from distlab.checks import CaseResult, CheckResult, is_stub, not_written
from distlab.comm_log import ring_bytes
from distlab.hardware.cost_model import bottleneck, predict_all_reduce
from distlab.topology import Cluster, Latencies, server_topology

RTOL = 0.02  # answers within 2% count as equal (rounding of GB/s and of 2(p-1)/p by hand)

MISTAKES = {
    "bidirectional": "you used NVLink's bidirectional (both directions added) figure; a ring sends one way "
                     "on each hop, so use the per-direction figure, half of it",
    "bits": "you used the NIC's Gb/s as if it were GB/s; divide gigabits by 8 to get gigabytes",
    "ring_factor": "you left out the ring's 2(p-1)/p factor: a ring all-reduce moves 2(p-1)/p n bytes per "
                   "rank, once in its reduce-scatter and once in its all-gather",
    "whole_vector": "you sent all n bytes across the network; after the reduce-scatter inside a server each "
                    "of its m GPUs owns n/m bytes, and each sends only that over its own NIC",
}


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RTOL)


def two_level_ring_time(server: str, nodes: int, nbytes: float, mistakes: tuple[str, ...] = ()) -> float:
    """Bandwidth term (latencies 0) of the two-level ring all-reduce, optionally with `mistakes` made.

    T = 2 (m-1)/m n / B_intra + 2 (N-1)/N (n/m) / B_nic, with B per direction, in bytes/s: B_intra is the
    slowest hop of the ring inside a server (all of a GPU's NVLinks on an NVSwitch server, one or two
    NVLinks on the DGX-1 cube-mesh), B_nic one GPU's share of the server's NICs.
    """
    unknown = set(mistakes) - set(MISTAKES)
    if unknown:
        raise ValueError(f"unknown mistakes {sorted(unknown)}; known: {', '.join(MISTAKES)}")
    spec = catalog.lookup("server", server)
    if spec.nics is None or spec.nic_Gbps is None:
        raise ValueError(f"server {server!r} has no NIC figures in the catalog; pick one of "
                         "DGX-1, DGX A100, DGX H100")
    m, big_n = spec.gpus, nodes
    intra = Cluster(server, 1)
    b_intra = bottleneck(intra.topology, [intra.gpu(0, j) for j in intra.intra_order]).GBps * 1e9
    b_nic = spec.nic_Gbps / 8 * 1e9 * spec.nics / m  # per GPU: NICs shared when there are fewer than GPUs
    b_intra *= 2 if "bidirectional" in mistakes else 1
    b_nic *= 8 if "bits" in mistakes else 1
    f_intra, f_inter = ring_bytes("all_reduce", 1.0, m), ring_bytes("all_reduce", 1.0, big_n)
    if "ring_factor" in mistakes:
        f_intra = f_inter = 1.0
    per_nic = nbytes if "whole_vector" in mistakes else nbytes / m
    return f_intra * nbytes / b_intra + f_inter * per_nic / b_nic


def diagnose(answer: float, variants: dict[tuple[str, ...], float], unit: str) -> tuple[bool, str]:
    """(right?, explanation): name the mistakes whose variant matches `answer`; variants[()] is right."""
    right = variants[()]
    if not (isinstance(answer, (int, float)) and math.isfinite(answer) and answer > 0):
        return False, f"Not yet: the answer must be a positive number of {unit}; got {answer!r}."
    if _close(answer, right):
        return True, f"Correct: {right:.4g} {unit}."
    for mistakes, value in sorted(variants.items(), key=lambda kv: len(kv[0])):
        if mistakes and _close(answer, value):
            why = "; and ".join(MISTAKES[k] for k in mistakes)
            return False, (f"Not yet: {answer:.4g} {unit} is what you get if {why}. "
                           f"The answer is {right:.4g} {unit}.")
    return False, (f"Not yet: {answer:.4g} {unit} matches none of the usual mistakes (per direction vs both, "
                   f"Gb vs GB, the 2(p-1)/p factor, n vs n/m on the network); the answer is {right:.4g} "
                   f"{unit}. Write each phase's bytes and bandwidth separately and add the times.")


Answer = float | Callable[[], float]


def _value(answer: Answer) -> float | None:
    """The student's number: `answer` itself, or what the function `answer` returns; None while that
    function is still the stub (it raises NotImplementedError)."""
    if not callable(answer):
        return answer
    try:
        return answer()
    except Exception as err:
        if is_stub(err):
            return None
        raise


def check_two_level_ring(answer_seconds: Answer, server: str = "DGX A100", nodes: int = 4,
                         nbytes: float = 2**30) -> CheckResult:
    """Check the two-level ring's bandwidth term for `nodes` x `server` and an `nbytes` all-reduce.
    `answer_seconds` is a number, or a function of no arguments that returns it."""
    variants = {ms: two_level_ring_time(server, nodes, nbytes, ms)
                for r in range(len(MISTAKES) + 1) for ms in itertools.combinations(MISTAKES, r)}
    model = Cluster(server, nodes, Latencies(0, 0, 0))  # the simulator must agree with the formula
    simulated = float(predict_all_reduce(model, nbytes, "two_level_ring"))
    if not _close(simulated, variants[()]):
        raise RuntimeError(f"formula {variants[()]} s and simulator {simulated} s disagree for {server}")
    label = f"{nodes} x {server}, all-reduce of {nbytes / 2**30:g} GiB"
    value = _value(answer_seconds)
    if value is None:
        return CheckResult("two-level ring, bandwidth term", [not_written(label)], case_heading="case")
    passed, line = diagnose(value, variants, "s")
    return CheckResult("two-level ring, bandwidth term", [CaseResult(label, passed, [line])],
                       case_heading="case")


def check_ring_bottleneck(answer_GBps: Answer,
                          order: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)) -> CheckResult:
    """Check the bandwidth (GB/s per direction) of the slowest hop of `order` on the DGX-1 cube-mesh.
    `answer_GBps` is a number, or a function of no arguments that returns it."""
    topo = server_topology("DGX-1")
    hop = bottleneck(topo, [f"gpu{i}" for i in order])
    right = hop.GBps
    variants = {(): right, ("bidirectional",): 2 * right, ("bits",): 8 * right,
                ("bidirectional", "bits"): 16 * right}
    label = "DGX-1 ring " + "-".join(map(str, order))
    value = _value(answer_GBps)
    if value is None:
        return CheckResult("ring bottleneck", [not_written(label)], case_heading="case")
    passed, line = diagnose(value, variants, "GB/s")
    lines = [line]
    if passed:
        lines.append(f"The slowest hop is {hop.src} -> {hop.dst} via {' -> '.join(hop.path)} "
                     f"({hop.bottleneck.kind}).")
    return CheckResult("ring bottleneck", [CaseResult(label, passed, lines)], case_heading="case")
