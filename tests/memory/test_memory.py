"""Chapter 7 (memory, the core half): accounting against prediction, recomputation parity, the estimator.

Mixed precision, accumulation and the exercises are in tests/memory/test_memory_precision.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from distlab.memory.__main__ import main
from distlab.memory.estimate import cost_model, estimator
from distlab.memory.estimate.estimator import MemoryConfig, estimate
from distlab.memory.measure.accounting import gpt_loss_fn, measure_step, saved_activation_bytes
from distlab.memory.techniques.recompute import (
    layer_options,
    plan_cost,
    plan_for_budget,
    policy_plan,
    recompute_forward,
)
from distlab.models import GPT, GPTConfig

# (layers, hidden, heads, batch, seq, vocab, bias): several sizes, batches and sequence lengths
SIZES = [(2, 64, 4, 4, 32, 16, True), (1, 32, 2, 2, 16, 11, False), (3, 48, 3, 8, 64, 20, True)]


def _gpt(L, h, a, s, V, bias=True, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=V, block_size=s, n_layer=L, n_head=a, n_embd=h, bias=bias))


def _batch(V, b, s, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(V, (b, s), generator=g), torch.randint(V, (b, s), generator=g)


@pytest.mark.parametrize(("L", "h", "a", "b", "s", "V", "bias"), SIZES)
def test_measured_step_matches_prediction_within_5_percent(L, h, a, b, s, V, bias):
    model = _gpt(L, h, a, s, V, bias)
    idx, y = _batch(V, b, s)
    got = measure_step(model, gpt_loss_fn(idx, y), torch.optim.Adam(model.parameters(), lr=1e-3))
    want = cost_model.predict_step(model.config, b, s)
    assert got.params_bytes == want.params_bytes == 4 * model.num_params()
    assert got.grads_bytes == want.grads_bytes
    assert got.optimizer_bytes == want.optimizer_bytes
    assert abs(got.activations_bytes - want.activations_bytes) <= 0.05 * got.activations_bytes
    # the peak splits exactly into its kinds, and holds every parameter and the optimizer state
    assert got.peak_params_bytes == got.params_bytes and got.peak_optimizer_bytes == got.optimizer_bytes
    assert got.peak_temporary_bytes >= 0 and got.peak_phase in ("forward", "backward", "optimizer")
    assert got.peak_bytes <= got.model_states_bytes + got.activations_bytes + got.peak_temporary_bytes


def test_math_attention_saves_the_s_squared_matrix_and_the_model_says_so():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = _gpt(2, 32, 4, 24, 13)
    idx, y = _batch(13, 3, 24)
    for backend, attention in ((SDPBackend.MATH, "math"), (SDPBackend.FLASH_ATTENTION, "flash")):
        with sdpa_kernel(backend):
            got = saved_activation_bytes(lambda: model(idx, y), model.parameters())
        want = cost_model.gpt_activation_bytes(model.config, 3, 24, attention)
        assert abs(got - want) <= 0.05 * got, attention


def test_korthikanti_terms_add_up_to_the_papers_formula():
    for s, b, h, a in ((2048, 1, 12288, 96), (512, 4, 1024, 16)):
        terms = cost_model.layer_activation_terms(s, b, h, a)
        assert sum(n for n, _ in terms.values()) == pytest.approx(
            cost_model.korthikanti_layer_bytes(s, b, h, a)
        )
        # Table 2: tensor parallelism t leaves 10 sbh unsplit; sequence parallelism splits everything
        t = 8
        with_tp = cost_model.layer_bytes(s, b, h, a, tp=t)
        assert with_tp == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
        with_sp = cost_model.layer_bytes(s, b, h, a, tp=t, sequence_parallel=True, recompute="selective")
        assert with_sp == pytest.approx(s * b * h * 34 / t)
        assert cost_model.layer_bytes(s, b, h, a, recompute="full") == 2 * s * b * h


def test_zero_table_1_is_reproduced():
    table = cost_model.zero_table()
    for dp, row in cost_model.ZERO_TABLE_1.items():
        for paper, ours in zip(row, table[dp], strict=True):
            assert abs(paper - ours) <= 0.05 + 0.01 * paper, (dp, row, table[dp])


def test_recompute_gives_bitwise_equal_gradients_and_predicted_savings():
    L, h, a, b, s, V = 4, 32, 4, 2, 16, 11
    model = _gpt(L, h, a, s, V)
    idx, y = _batch(V, b, s)
    model(idx, y)[1].backward()
    ref = [p.grad.clone() for p in model.parameters()]
    head = (
        cost_model.gpt_activation_bytes(model.config, b, s)
        - L * layer_options(model.config, b, s)["none"].saved_bytes
    )
    plans = [policy_plan(p, L) for p in cost_model.RECOMPUTE] + [["core+mlp", "mlp", "none", "block"]]
    for plan in plans:
        model.zero_grad()
        recompute_forward(model, idx, y, plan=plan)[1].backward()
        assert all(torch.equal(p.grad, r) for p, r in zip(model.parameters(), ref, strict=True)), plan
        got = saved_activation_bytes(
            lambda plan=plan: recompute_forward(model, idx, y, plan=plan), model.parameters()
        )
        assert got == pytest.approx(plan_cost(model.config, b, s, plan)[0] + head), plan
    for segments in ([2, 2], [1, 3], [4], cost_model.sqrt_segments(L)):
        model.zero_grad()
        recompute_forward(model, idx, y, segments=segments)[1].backward()
        assert all(torch.equal(p.grad, r) for p, r in zip(model.parameters(), ref, strict=True)), segments


def test_cost_aware_plan_fits_the_budget_and_spans_keep_all_to_full():
    config = GPTConfig(vocab_size=100, block_size=2048, n_layer=8, n_head=16, n_embd=1024)
    opts = layer_options(config, 1, 2048, "math", 2)
    keep_all = 8 * opts["none"].saved_bytes
    assert plan_for_budget(config, 1, 2048, keep_all, "math", 2) == ["none"] * 8
    assert plan_for_budget(config, 1, 2048, 8 * opts["block"].saved_bytes, "math", 2) == ["block"] * 8
    # with math attention the core frees the most bytes per FLOP, so it goes first (Korthikanti et al.)
    assert set(plan_for_budget(config, 1, 2048, keep_all * 0.7, "math", 2)) <= {"core", "none"}
    for frac in (0.9, 0.6, 0.3):
        plan = plan_for_budget(config, 1, 2048, keep_all * frac, "math", 2)
        kept, flops = plan_cost(config, 1, 2048, plan, "math", 2)
        assert kept <= keep_all * frac and flops <= plan_cost(config, 1, 2048, ["block"] * 8, "math", 2)[1]
    with pytest.raises(ValueError, match="below what full recomputation keeps"):
        plan_for_budget(config, 1, 2048, 10.0)


def test_sqrt_segments_are_optimal():
    from distlab.memory.exercises import best_segment_cost

    for n in range(1, 101):
        seg = cost_model.sqrt_segments(n)
        assert sum(seg) == n and cost_model.segment_peak_units(seg) == best_segment_cost(n)


def test_pipeline_in_flight_formulas_match_chapter_4_simulation():
    from distlab.pipeline.schedules import make_schedule
    from distlab.pipeline.simulate import simulate, timeline_stats

    for schedule, p, m, v in (
        ("gpipe", 4, 8, 1),
        ("1f1b", 4, 8, 1),
        ("1f1b", 4, 2, 1),
        ("interleaved", 4, 8, 2),
        ("interleaved", 2, 4, 3),
    ):
        c = MemoryConfig(
            layers=p * v * 2,
            hidden=64,
            heads=4,
            vocab=10,
            pp=p,
            microbatches=m,
            schedule=schedule,
            interleave=v,
        )
        chunks = timeline_stats(simulate(make_schedule(schedule, p, m, v)), p).peak_stash[0]
        assert estimator.in_flight_layers(c) == pytest.approx(chunks * c.layers / (p * v)), schedule


def test_estimator_matches_measurement_of_the_course_gpt():
    for L, h, a, b, s, V, _ in SIZES[:2]:
        model = _gpt(L, h, a, s, V)
        idx, y = _batch(V, b, s)
        for policy in cost_model.RECOMPUTE:
            plan = policy_plan(policy, L)
            got = measure_step(
                model,
                lambda m, plan=plan, idx=idx, y=y: recompute_forward(m, idx, y, plan=plan)[1],
                torch.optim.Adam(model.parameters()),
            )
            e = estimate(
                MemoryConfig(
                    layers=L,
                    hidden=h,
                    heads=a,
                    vocab=V,
                    seq=s,
                    micro_batch=b,
                    precision="fp32",
                    attention="flash",
                    dropout=False,
                    recompute=policy,
                )
            )
            assert abs(e.model_states_bytes - got.model_states_bytes) <= 0.05 * got.model_states_bytes
            assert abs(e.activations_bytes - got.activations_bytes) <= 0.05 * got.activations_bytes, policy


def test_cli_params_dp_zero_alone_prints_json(capsys):
    main(["estimate", "--params", "7.5e9", "--dp", "64", "--zero", "2", "--json"])
    data = json.loads(capsys.readouterr().out)
    for key in (
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "model_states_bytes",
        "activations_bytes",
        "total_bytes",
    ):
        assert key in data
    assert data["total_bytes"] / 1e9 == pytest.approx(16.6, abs=0.05)  # ZeRO Table 1, P_os+g, N_d = 64


def test_cli_full_configuration_and_help(capsys):
    main(
        [
            "estimate",
            "--layers",
            "96",
            "--hidden",
            "12288",
            "--heads",
            "96",
            "--vocab",
            "50257",
            "--tp",
            "8",
            "--pp",
            "8",
            "--dp",
            "16",
            "--zero",
            "1",
            "--recompute",
            "selective",
            "--sequence-parallel",
            "--offload",
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert data["optimizer_bytes"] == 0 and data["host_bytes"] > 0 and data["activations_bytes"] > 0
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    text = capsys.readouterr().out
    for option in (
        "--params",
        "--dp",
        "--tp",
        "--pp",
        "--cp",
        "--zero",
        "--recompute",
        "--offload",
        "--precision",
        "--schedule",
        "--micro-batch",
        "--seq",
        "--vocab",
        "--layers",
        "--hidden",
        "--heads",
    ):
        assert option in text
    assert "(default: 1)" in text and "(default: mixed)" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--params", "1e9", "--zero", "4"], "invalid choice: 4"),
        (["--params", "1e9", "--dp", "0"], "must be at least 1"),
        (["--params", "1e9", "--tp", "two"], "'two' is not a whole number"),
        (
            ["--layers", "4", "--hidden", "64", "--heads", "6", "--vocab", "10"],
            "hidden=64 is not divisible by heads=6",
        ),
        (
            ["--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "10", "--tp", "3"],
            "heads=4 is not divisible by tensor-parallel size tp=3",
        ),
        (
            ["--layers", "6", "--hidden", "64", "--heads", "4", "--vocab", "10", "--pp", "4"],
            "layers=6 is not divisible by pp * interleave = 4",
        ),
        (
            ["--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "10", "--seq", "100", "--cp", "3"],
            "seq=100 is not divisible by context-parallel size cp=3",
        ),
        (
            ["--params", "7.5e9", "--offload", "--host-memory-gb", "100"],
            "offload needs 720.0 GB of host memory per node",
        ),
        (["--layers", "4", "--hidden", "64"], "layers, hidden, heads and vocab go together"),
        ([], "give params"),
    ],
)
def test_cli_bad_values_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["estimate", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_estimator_errors_name_the_value():
    with pytest.raises(ValueError, match="zero=5 is not a ZeRO stage"):
        estimate(MemoryConfig(params=1e9, zero=5))
    with pytest.raises(ValueError, match="the interleaved schedule needs interleave >= 2"):
        estimate(MemoryConfig(layers=8, hidden=64, heads=4, vocab=10, pp=2, schedule="interleaved"))
    with pytest.raises(ValueError, match="precision='fp8' is unknown"):
        estimate(MemoryConfig(params=1e9, precision="fp8"))


def test_recompute_plan_errors():
    model = _gpt(2, 32, 2, 8, 5)
    idx, y = _batch(5, 1, 8)
    with pytest.raises(ValueError, match="plan has 1 entries for a model of n_layer=2"):
        recompute_forward(model, idx, y, plan=["block"])
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['all'\]"):
        recompute_forward(model, idx, y, plan=["all", "none"])
    with pytest.raises(ValueError, match="must be positive lengths that add up to n_layer=2"):
        recompute_forward(model, idx, y, segments=[3])
