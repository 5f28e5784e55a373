"""The instructor-only cases of every exercise: other sizes, world sizes, uneven splits, seeds.

A student runs an exercise's public cases (the check call in the lab); `distlab grade` runs these too, so
that a solution tuned to the public cases does not pass. This module is kept out of what students get, as
the worked solutions are: the student versions of the labs (`make student`, `make lab`) never import or
mention it, and the public book does not include it (`tests/grading/test_hidden_cases.py` checks both).

`HIDDEN[check]` is a `Hidden`: what its cases cover (the instructors' page of the book prints this), and
`run(*args)`, which takes the arguments the lab passes to the check (the student's functions first) and
returns a `CheckResult` of the hidden cases. An exercise whose function takes no arguments (its answer is
one number for the lab's own setup) has no hidden case: `run` is None and `covers` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distlab.checks import CheckResult


@dataclass(frozen=True)
class Hidden:
    """The hidden cases of one check: what they cover, and how to run them (None: there are none)."""

    covers: str
    run: Callable[..., CheckResult] | None


def _ring(fn: Any, *_: Any) -> CheckResult:
    from distlab.collectives.exercises import check_ring_all_reduce
    return check_ring_all_reduce(fn, world_sizes=(3,), counts=(1, 2, 5, 11, 29), progress=False)


def _two_level(fn: Any, *_: Any) -> CheckResult:
    from distlab.collectives.exercises import check_two_level_all_reduce
    return check_two_level_all_reduce(fn, layouts=((4, 1), (1, 2)), counts=(3, 7), progress=False)


def _bucketed(fn: Any, *_: Any) -> CheckResult:
    from distlab.data_parallel.exercises import check_bucketed_all_reduce
    return check_bucketed_all_reduce(fn, world_sizes=(4,))


def _may_start(fn: Any, *_: Any) -> CheckResult:
    from distlab.async_sgd.exercises import check_may_start
    return check_may_start(fn, rules=(
        (7, (7, 2, 5), 5, "a worker exactly s = 5 clocks ahead of the slowest may go on"),
        (8, (2, 8, 7), 5, "a worker s + 1 = 6 clocks ahead of the slowest must wait"),
        (1, (1, 1), 0.5, "a fractional staleness bound: a gap of 0 is within 0.5"),
        (3, (1, 2, 3, 3), 1.5, "a gap of 2 exceeds s = 1.5: wait"),
    ))


def _one_f_one_b(fn: Any, *_: Any) -> CheckResult:
    from distlab.pipeline.exercises import check_one_f_one_b
    return check_one_f_one_b(fn, run=False, shapes=((5, 3), (5, 12), (6, 6), (3, 1)))


def _zb_h1(fn: Any, *_: Any) -> CheckResult:
    from distlab.pipeline.exercises import check_zb_h1_rank
    return check_zb_h1_rank(fn, shapes=((5, 7, 4), (5, 3, 2), (6, 12, 0), (6, 12, 5)))


def _tensor_parallel(f: Any, g: Any, shard: Any, row_linear: Any, *_: Any) -> CheckResult:
    from distlab.tensor_parallel.exercises import check_tensor_parallel
    return check_tensor_parallel(f, g, shard, row_linear, world_sizes=(4,))


def _loss_scale(fn: Any, *_: Any) -> CheckResult:
    from distlab.memory.exercises import check_loss_scale_update
    return check_loss_scale_update(fn, scripts=(
        ("two overflows in a row", (65536.0, 3), (True, True, False), 2, 2.0, 0.5),
        ("growth_interval of 1", (1.0, 0), (False, False, False), 1, 3.0, 0.5),
        ("one step short of the interval", (8.0, 4), (False, False), 5, 2.0, 0.125),
    ))


def _owners(fn: Any, *_: Any) -> CheckResult:
    from distlab.memory.muon.exercises import check_owners
    return check_owners(fn, cases=(
        ("six uneven shapes on 5 ranks", ((300, 20), (20, 300), (128, 128), (64, 512), (7, 7), (100, 3)), 5),
        ("two matrices on 1 rank", ((64, 64), (32, 16)), 1),
        ("3 GPT blocks, width 96, on 4 ranks", ((288, 96), (96, 96), (384, 96), (96, 384)) * 3, 4),
    ))


def _segments(fn: Any, *_: Any) -> CheckResult:
    from distlab.memory.exercises import check_sqrt_segments
    return check_sqrt_segments(fn, sizes=(3, 5, 7, 12, 30, 64, 99, 200))


def _coordinates(fn: Any, *_: Any) -> CheckResult:
    from distlab.parallel3d.exercises import check_coordinates
    return check_coordinates(fn, grids=((2, 2, 3), (4, 1, 1), (1, 1, 1), (3, 2, 2)))


def _placement(fn: Any, *_: Any) -> CheckResult:
    from distlab.parallel3d import Plan3D
    from distlab.parallel3d.exercises import check_placement
    return check_placement(fn, settings=(("DGX H100", 4, Plan3D(dp=4, pp=2, tp=4, m=8, zero_stage=1)),
                                         ("DGX A100", 2, Plan3D(dp=2, pp=2, tp=4, m=4, zero_stage=0))))


def _dp_term(fn: Any, *_: Any) -> CheckResult:
    from distlab.plan.exercises import check_dp_term
    return check_dp_term(fn, settings=((8e9, 16, 2, 3, 1e-5, 100.0), (5e5, 2, 3, 1, 0.0, 12.5),
                                       (3e9, 5, 1, 7, 2e-6, 50.0), (1e9, 1, 3, 4, 5e-6, 25.0)))


def _steps_lost(fn: Any, *_: Any) -> CheckResult:
    from distlab.parallel3d.checkpoint.exercises import check_steps_lost
    return check_steps_lost(fn, settings=((1, 1), (3, 3), (13, 5), (1000, 64), (2, 7)))


def _zigzag(fn: Any, *_: Any) -> CheckResult:
    from distlab.context_parallel.exercises import check_zigzag_chunks
    return check_zigzag_chunks(fn, world_sizes=(5, 6, 8))


def _healing(fn: Any, *_: Any) -> CheckResult:
    from distlab.fault_tolerance.exercises import check_healing_fraction
    return check_healing_fraction(fn, settings=((7200.0, 1.0, 2.0, 30.0, 4, 600.0),
                                                (50.0, 5.0, 20.0, 60.0, 2, 100.0),
                                                (1e6, 0.1, 0.0, 0.0, 16, 0.0)))


def _outer_step(fn: Any, *_: Any) -> CheckResult:
    from distlab.fault_tolerance.exercises import check_outer_step
    return check_outer_step(fn, settings=((5, 0.3, 0.95, True), (2, 0.9, 0.0, False), (6, 0.7, 0.9, False)))


def _tp_bytes(fn: Any, layout: Any, rank: int, *_: Any) -> CheckResult:
    from distlab.dryrun import from_published
    from distlab.dryrun.exercises import check_tp_bytes
    other = from_published("llama3-405b-16k", layers=16, microbatches=8)
    results = [check_tp_bytes(fn, other, r) for r in (0, 7)]
    return CheckResult(results[0].exercise, [c for r in results for c in r.cases], case_heading="layout")


def _gating(fn: Any, *_: Any) -> CheckResult:
    from distlab.moe.exercises import check_top_k_gating
    return check_top_k_gating(fn, shapes=((20, 5, 2, 6), (7, 7, 1, 1), (10, 2, 2, 10)), seed=13)


def _dispatch(fn: Any, *_: Any) -> CheckResult:
    from distlab.moe.exercises import check_dispatch_combine
    return check_dispatch_combine(fn, routings=((15, 3, 1, 0.5), (9, 6, 3, 1.25)))


def _zero2(fn: Any, *_: Any) -> CheckResult:
    from distlab.memory.zero.exercises import check_zero2_hook
    return check_zero2_hook(fn, phases=([[0, 2], [1, 3]], [[1, 2, 3]], [[3, 0]]))


def _merge(fn: Any, *_: Any) -> CheckResult:
    from distlab.context_parallel.exercises import check_merge
    return check_merge(fn, seed=11)


def _find_hang(fn: Any, *_: Any) -> CheckResult:
    from distlab.observe.exercises import check_find_hang
    return check_find_hang(fn, trials=60, seed=101, worlds=(3, 6, 8))


NO_ARGUMENTS = "none: the function takes no arguments, its answer is one number for the lab's setup"
HIDDEN: dict[str, Hidden] = {
    "check_ring_all_reduce": Hidden("3 ranks on 1, 2, 5, 11 and 29 elements (empty and uneven chunks)",
                                    _ring),
    "check_two_level_all_reduce": Hidden("4 nodes x 1 rank and 1 node x 2 ranks, 3 and 7 elements",
                                         _two_level),
    "check_bucketed_all_reduce": Hidden("4 ranks (the lab runs 2 and 3)", _bucketed),
    "check_may_start": Hidden("4 other clocks: s = 5 at and past the bound, a fractional s of 0.5 and 1.5",
                              _may_start),
    "check_one_f_one_b": Hidden("p, m = (5, 3), (5, 12), (6, 6), (3, 1): more stages, m < p, m = 1",
                                _one_f_one_b),
    "check_zb_h1_rank": Hidden("(p, m, rank) = (5, 7, 4), (5, 3, 2), (6, 12, 0), (6, 12, 5)", _zb_h1),
    "check_tensor_parallel": Hidden("4 ranks (the lab runs 2 and 3)", _tensor_parallel),
    "check_top_k_gating": Hidden("(T, E, k, capacity) = (20, 5, 2, 6), (7, 7, 1, 1), (10, 2, 2, 10), other "
                                 "logits (seed 13)", _gating),
    "check_dispatch_combine": Hidden("(T, E, k, capacity factor) = (15, 3, 1, 0.5), (9, 6, 3, 1.25)",
                                     _dispatch),
    "check_loss_scale_update": Hidden("two overflows in a row, growth_interval 1, a tracker one short of the "
                                      "interval (factors 3 and 1/8)", _loss_scale),
    "check_sqrt_segments": Hidden("n = 3, 5, 7, 12, 30, 64, 99, 200 layers", _segments),
    "check_owners": Hidden("six uneven shapes on 5 ranks, one rank, 3 GPT blocks of width 96 on 4 ranks",
                           _owners),
    "check_zero2_hook": Hidden("groups of global ranks not in a row: {0, 2} with {1, 3}, {1, 2, 3}, {3, 0}",
                               _zero2),
    "check_two_level_ring": Hidden(NO_ARGUMENTS, None),
    "check_ring_bottleneck": Hidden(NO_ARGUMENTS, None),
    "check_coordinates": Hidden("grids (dp, pp, tp) = (2, 2, 3), (4, 1, 1), (1, 1, 1), (3, 2, 2)",
                                _coordinates),
    "check_placement": Hidden("4 x DGX H100 with dp 4, pp 2, tp 4; 2 x DGX A100 with dp 2, pp 2, tp 4",
                              _placement),
    "check_dp_term": Hidden("ZeRO 1-3 on dp = 16, 5, 2 and 1, latency 0, other bandwidths", _dp_term),
    "check_steps_lost": Hidden("kill_at, every = (1, 1), (3, 3), (13, 5), (1000, 64), (2, 7)", _steps_lost),
    "check_merge": Hidden("the same three blocks with other queries, keys and values (seed 11)", _merge),
    "check_zigzag_chunks": Hidden("p = 5, 6 and 8 (the lab runs 1 to 4)", _zigzag),
    "check_healing_fraction": Hidden("3 other settings: R = 4 and 16 replicas, a fraction clipped at 0, no "
                                     "detection or healing time", _healing),
    "check_outer_step": Hidden("R = 5, 2 and 6 replicas, mu = 0.95 and 0, first rounds", _outer_step),
    "check_find_hang": Hidden("3, 6 and 8 ranks, 60 other plantings each (seed 101; the lab runs 4 and 5)",
                              _find_hang),
    "check_tp_bytes": Hidden("the lab's model with 8 micro-batches, ranks 0 and 7", _tp_bytes),
}
