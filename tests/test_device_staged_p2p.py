"""The course's point-to-point messages go through `distlab.staged_p2p` (issue 34, many ranks on one GPU):
gloo cannot send or receive CUDA tensors, so a CUDA tensor on a gloo group is sent from a host copy and
received into a host buffer. Without a GPU here, the tests force the staging on for CPU tensors, record
every host copy and buffer it makes, and check that each chapter's point-to-point code (chapter 1's ring,
trees and all-to-all, the ping-pong fit, pipeline messages, ring attention, collective matmuls,
asynchronous SGD's messages) stages through it and returns exactly what it returns unstaged. A host copy
stands for its tensor's device in `gpu_check.rules.RuleLog`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from distlab import launch, staged_p2p


def test_only_cuda_tensors_on_gloo_are_staged() -> None:
    cases = {("cuda", "gloo"): True, ("cpu", "gloo"): False, ("cuda", "nccl"): False,
             ("meta", "gloo"): False}
    assert {case: staged_p2p.needs_staging(torch.device(case[0]), case[1]) for case in cases} == cases


@contextmanager
def _forced(counts: Counter, stands_for: str | None = None) -> Iterator[None]:
    """Stage every message on gloo (CPU tensors included) and count the host copies and buffers; with
    `stands_for`, each host copy stands for a tensor on that device (as for a CUDA tensor)."""
    copy, buffer = staged_p2p.host_copy, staged_p2p.host_buffer

    def mark(host: torch.Tensor) -> torch.Tensor:
        if stands_for is not None:
            setattr(host, staged_p2p.STAGED, torch.device(stands_for))
        return host

    def counted_copy(t: torch.Tensor) -> torch.Tensor:
        counts["sent"] += 1
        return mark(copy(t))

    def counted_buffer(t: torch.Tensor) -> torch.Tensor:
        counts["received"] += 1
        return mark(buffer(t))

    with mock.patch.object(staged_p2p, "needs_staging", lambda device, backend: backend == "gloo"), \
            mock.patch.object(staged_p2p, "host_copy", counted_copy), \
            mock.patch.object(staged_p2p, "host_buffer", counted_buffer):
        yield


def _collectives() -> list[torch.Tensor]:
    from distlab.collectives import (
        pairwise_all_to_all,
        ring_all_reduce,
        segmented_ring_all_reduce,
        tree_broadcast,
    )

    r, p = dist.get_rank(), dist.get_world_size()
    x = torch.arange(40, dtype=torch.float64) * (r + 1)
    blocks = [torch.full((q + 1, 2), float(10 * r + q)) for q in range(p)]
    return [ring_all_reduce(x.clone()), segmented_ring_all_reduce(x.clone()), tree_broadcast(x.clone(), 1),
            torch.cat(pairwise_all_to_all(blocks))]


def _pipeline() -> list[torch.Tensor]:
    from distlab.pipeline.p2p import PointToPoint

    r = dist.get_rank()
    return [PointToPoint().exchange(torch.full((3, 4), float(r)), r ^ 1)]


def _ring_attention() -> list[torch.Tensor]:
    from distlab.context_parallel.parity import attention_parity

    report = attention_parity("zigzag", 0, 1, 2, 16, 4)
    return [torch.tensor([report.passed, report.bytes_forward, report.bytes_backward])]


def _collective_matmul() -> list[torch.Tensor]:
    from distlab.tensor_parallel.collective_matmul import all_gather_matmul, matmul_reduce_scatter

    g = torch.Generator().manual_seed(dist.get_rank())
    x, w = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((2, 3, 5), (5, 6)))
    gathered = all_gather_matmul(x, w)
    return [*gathered, matmul_reduce_scatter(torch.randn(2, 12, 5, generator=g, dtype=torch.float64), w)]


def _async_sgd() -> list[torch.Tensor]:
    from distlab.async_sgd.messages import Kind, recv_message, send_message

    r = dist.get_rank()
    if r % 2 == 0:
        send_message(Kind.PUSH, r, 7, torch.arange(6.0) + r, r + 1)
        return []
    m = recv_message(r - 1)
    return [torch.tensor([int(m.kind), m.worker, m.version]), m.payload]


def _ping_pong() -> list[torch.Tensor]:
    from distlab.collectives.fit import ping_pong

    return [torch.tensor(len(ping_pong((4, 64), repeats=1)))]


SECTIONS: dict[str, Callable[[], list[torch.Tensor]]] = {
    "collectives": _collectives, "pipeline": _pipeline, "ring_attention": _ring_attention,
    "collective_matmul": _collective_matmul, "async_sgd": _async_sgd, "ping_pong": _ping_pong}


def _both_ways(name: str) -> dict:
    """Inside a rank: one section unstaged, then staged; both results and the staging counts."""
    plain = SECTIONS[name]()
    counts: Counter = Counter()
    with _forced(counts):
        staged = SECTIONS[name]()
    return {"plain": plain, "staged": staged, "counts": dict(counts)}


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_each_chapters_point_to_point_stages_and_gives_the_same_results(name: str) -> None:
    for rank, out in enumerate(launch.run(_both_ways, 4, name, backend="gloo")):
        assert len(out["plain"]) == len(out["staged"]), (name, rank)
        assert all(torch.equal(a, b) for a, b in zip(out["plain"], out["staged"], strict=True)), (name, rank)
        silent = name == "ping_pong" and rank >= 2  # the ping-pong is between ranks 0 and 1 only
        assert silent or out["counts"].get("sent", 0) > 0 or out["counts"].get("received", 0) > 0, \
            (name, rank, out["counts"])


def _rule_log_sees_the_device_a_copy_stands_for() -> dict:
    """Inside a rank: a staged exchange under a strict RuleLog whose device is a GPU passes, and records
    the GPU; an unstaged CPU tensor under the same rule is refused."""
    from distlab.gpu_check.rules import DeviceError, RuleLog

    r = dist.get_rank()
    out = {}
    with _forced(Counter(), stands_for="cuda:0"), RuleLog(device="cuda:0", strict=True) as log:
        send = staged_p2p.isend(torch.ones(3), group_dst=1 - r)
        buf = torch.zeros(3)
        staged_p2p.irecv(buf, group_src=1 - r).wait()
        send.wait()
    out["devices"] = sorted({d for c in log.calls for d in c.devices})
    out["received"] = buf.tolist()
    try:
        with RuleLog(device="cuda:0", strict=True):
            dist.all_reduce(torch.ones(1))
        out["plain"] = "accepted"
    except DeviceError:
        out["plain"] = "refused"
    return out


def test_rule_log_takes_a_host_copy_for_the_device_it_stands_for() -> None:
    for out in launch.run(_rule_log_sees_the_device_a_copy_stands_for, 2, backend="gloo"):
        assert out == {"devices": ["cuda"], "received": [1.0, 1.0, 1.0], "plain": "refused"}, out
