"""Chapter 4: pipeline schedules as data, their simulation, and parity of the executor with one process.

Parity tolerance: float32, atol 1e-6. A pipeline sums each parameter's gradient over m microbatches
instead of over the whole batch at once, which only re-associates a float32 sum of at most 48 terms of
size ~1 (relative error ~ 48 * 6e-8 < 1e-5); the observed differences are ~1e-8. No test asserts on
timings. A hang would be ended by the launcher's timeout (30 s per receive).
"""

from __future__ import annotations

import matplotlib
import pytest

from distlab import launch
from distlab.models import MLP, regression_data
from distlab.pipeline import exercises, figures
from distlab.pipeline.partition import balanced_boundaries, parameter_costs
from distlab.pipeline.schedules import (
    Action,
    DeadlockError,
    add_communication,
    bubble_fraction,
    make_schedule,
    one_f_one_b_order,
)
from distlab.pipeline.simulate import simulate, timeline_stats
from distlab.pipeline.train import max_difference, merge, reference_step, split_microbatches, steps_on_rank
from distlab.pipeline.validate import validate

matplotlib.use("Agg")
ATOL = 1e-6
GRID = [(name, p, m, v) for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 5, 8)
        for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3))
        if name != "interleaved" or m % p == 0]


@pytest.mark.parametrize("name,p,m,v", GRID)
def test_schedules_are_valid_and_match_the_bubble_formula(name: str, p: int, m: int, v: int) -> None:
    s = make_schedule(name, p, m, v)
    validate(s, "gloo")
    if name != "interleaved":  # posting each run of messages together suffices on NCCL too
        validate(s, "nccl")
    validate(make_schedule(name, p, m, v, rendezvous_safe=True), "nccl")
    stats = timeline_stats(simulate(s, 1.0 / v, 2.0 / v), p)
    assert stats.mean_bubble == pytest.approx(bubble_fraction(p, m, v), abs=1e-12)
    sends = sum(a.op.startswith("send") for actions in s.actions for a in actions)
    assert sends == (2 * m * (p * v - 1) if p > 1 else 0)  # each boundary between ranks, both ways
    if name == "gpipe":
        assert stats.peak_stash == (m,) * p
    elif name == "1f1b":
        assert stats.peak_stash == tuple(min(p - r, m) for r in range(p))


def test_interleaved_lazy_order_is_not_rendezvous_safe_and_validate_says_so() -> None:
    with pytest.raises(DeadlockError, match="rendezvous_safe=True"):
        validate(make_schedule("interleaved", 2, 4, 2), "nccl")


def test_partition_balances_parameters_and_rejects_too_many_stages() -> None:
    layers = MLP([16, 64, 64, 64, 64, 8]).layers
    bounds = balanced_boundaries(parameter_costs(layers), 4)
    assert bounds == [0, 2, 4, 6, 9]
    with pytest.raises(ValueError, match=r"num_stages=10 is more than the 9 layers.*at most 9 stages"):
        balanced_boundaries(parameter_costs(layers), 10)


def test_bad_inputs_name_the_value_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"m=5 to be a multiple of p=2.*use m=4 or m=6"):
        make_schedule("interleaved", 2, 5, 2)
    with pytest.raises(ValueError, match=r"m=0 microbatches.*use m >= 1"):
        make_schedule("1f1b", 2, 0)
    X, y = regression_data(10, 4, 2, seed=0)
    with pytest.raises(ValueError,
                       match=r"batch size 10 is not divisible by m=4.*choose m from \[1, 2, 5, 10\]"):
        split_microbatches(X, y, 4)
    with pytest.raises(ValueError, match=r"schedule='zb' is not known"):
        make_schedule("zb", 2, 2)
    with pytest.raises(ValueError, match=r"v=2 model chunks per rank only applies to the 'interleaved'"):
        make_schedule("gpipe", 2, 2, 2)
    with pytest.raises(ValueError, match=r"v=0 model chunks per rank must be a positive integer"):
        bubble_fraction(4, 8, 0)


def test_validate_finds_b_before_f_and_deadlocks() -> None:
    good = one_f_one_b_order(2, 2)
    swapped = [list(reversed(good[0])), good[1]]
    with pytest.raises(DeadlockError, match="B before F"):
        add_communication("x", swapped, 2, 2)
    no_warmup = [[Action("F", 0, 0), Action("B", 0, 0), Action("F", 1, 0), Action("B", 1, 0)],
                 [Action("F", 0, 1), Action("F", 1, 1), Action("B", 0, 1), Action("B", 1, 1)]]
    with pytest.raises(DeadlockError, match=r"rank 0 at action 1 \(B0 of stage 0\) waits for the gradient"):
        add_communication("no warm-up", no_warmup, 2, 2)
    three = [[Action("F", 0, 0), Action("B", 0, 0), Action("F", 1, 0), Action("B", 1, 0)],
             *one_f_one_b_order(3, 2)[1:]]
    with pytest.raises(DeadlockError, match="rank 0 at action 1"):
        add_communication("short warm-up", three, 3, 2)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_every_schedule_matches_single_process_training(p: int) -> None:
    sizes = [8, 32, 32, 32, 32, 4]  # 9 layers: up to 4 ranks x 2 chunks
    X, y = regression_data(24, 8, 4, seed=0)
    ms = [1, 2, 3, 4, 6] if p < 4 else [1, 3, 4, 6]  # m < p, m not a multiple of p, m > p
    configs = [("naive", 1, 1)] + [(n, m, 1) for n in ("gpipe", "1f1b") for m in ms]
    configs += [("interleaved", m, 2) for m in (p, 2 * p) if 24 % m == 0 and 2 * p <= 9]
    results = launch.run(steps_on_rank, p, configs, sizes, X, y)
    ref_grads, ref_params = reference_step(sizes, X, y)
    for k, config in enumerate(configs):
        grads, params = merge([r[k] for r in results])
        assert max_difference(grads, ref_grads) < ATOL, config
        assert max_difference(params, ref_params) < ATOL, config
        stash = [r[k].run.peak_stash for r in results]
        name, m, v = config
        if name == "1f1b":
            assert stash == [min(p - r, m) for r in range(p)], config
        if name == "gpipe":
            assert stash == [m] * p, config
        assert all(r[k].run.peak_stash_bytes > 0 for r in results)


def test_exercise_check_accepts_the_solution_and_diagnoses_mistakes() -> None:
    def solution(p, m):
        return [[(a.op, a.microbatch) for a in order] for order in one_f_one_b_order(p, m)]

    assert exercises.check_one_f_one_b(solution).ok

    def no_warmup(p, m):
        return [[x for i in range(m) for x in (("F", i), ("B", i))] for _ in range(p)]

    rep = exercises.check_one_f_one_b(no_warmup, run=False)
    assert not rep.ok and "rank 0 runs 1 forwards before its first backward" in str(rep)

    def reversed_warmup(p, m):  # rank r warms up with r forwards instead of p - r - 1
        orders = []
        for r in range(p):
            w = min(r, m)
            order = [("F", i) for i in range(w)]
            for i in range(m - w):
                order += [("F", w + i), ("B", i)]
            orders.append(order + [("B", i) for i in range(m - w, m)])
        return orders

    rep = exercises.check_one_f_one_b(reversed_warmup, run=False)
    assert not rep.ok and "the compute order deadlocks" in str(rep)
    assert "rank 0 at action 1 (B0 of stage 0) waits" in str(rep)

    def missing_backward(p, m):
        return [order[:-1] for order in solution(p, m)]

    rep = exercises.check_one_f_one_b(missing_backward, run=False)
    assert not rep.ok and "missing backward for microbatch" in str(rep)

    def gpipe_like(p, m):
        return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]

    rep = exercises.check_one_f_one_b(gpipe_like, run=False)
    assert not rep.ok and "forwards before its first backward; 1F1B runs" in str(rep)


def test_figures_draw() -> None:
    for fig in (figures.schedules_figure(3, 3, 2), figures.bubble_figure(3, (3, 6)),
                figures.stash_figure(3, 6, 2)):
        assert fig.axes and fig.axes[0].get_title()


def _gpt_steps(config, idx, targets, configs):
    from distlab.pipeline.gpt import gpt_pipeline_step

    p, rank = launch.world_size(), launch.rank()
    return [gpt_pipeline_step(config, idx, targets, make_schedule(n, p, m, v), rank) for n, m, v in configs]


def test_gpt_blocks_pipeline_matches_single_process_with_the_tied_embedding_all_reduced() -> None:
    import torch

    from distlab.models import CharTokenizer, GPTConfig, char_corpus, get_batch
    from distlab.pipeline.gpt import gpt_reference_step

    text = char_corpus(200)
    tok = CharTokenizer(text)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=4, n_head=2, n_embd=32)
    idx, targets = get_batch(tok.encode(text), 16, 12, torch.Generator().manual_seed(0))
    configs = [("gpipe", 4, 1), ("1f1b", 2, 1), ("interleaved", 3, 2)]  # 3 ranks; 6 layers = 3 x 2 chunks
    results = launch.run(_gpt_steps, 3, config, idx, targets, configs)
    ref_grads, ref_params = gpt_reference_step(config, idx, targets)
    for k, c in enumerate(configs):
        grads, params = merge([r[k] for r in results])
        assert max_difference(grads, ref_grads) < ATOL, c
        assert max_difference(params, ref_params) < ATOL, c
        assert "wte.weight" in results[0][k].grads and "wte.weight" in results[2][k].grads


def test_command_line_rejects_bad_arguments_before_starting_ranks(capsys: pytest.CaptureFixture) -> None:
    from distlab.pipeline.__main__ import main

    with pytest.raises(SystemExit):
        main(["--schedule", "interleaved", "-m", "3", "-v", "2", "--world-size", "2"])
    assert "m=3 to be a multiple of p=2" in capsys.readouterr().err
