"""Chapter 7: the predicted peak of a training step (`distlab.memory.measure.peak`) against the measured one.

The grid covers what the chapter teaches in one process: recomputation none, selective and full; fp32
and mixed precision (a bf16 model with fp32 master weights); models with and without biases; peaks that
fall in backward and in the optimizer's step. The goal is 5 %; on CPU the model counts every tensor, so
the prediction is in fact exact, and the test says so when it is not.
"""

from __future__ import annotations

import json

import pytest

from distlab.memory.__main__ import main
from distlab.memory.estimate.estimator import MemoryConfig
from distlab.memory.measure.accounting import measure_gpt_step
from distlab.memory.measure.peak import KINDS, Timeline, gpt_parameter_sizes, predict_peak

# (layers, hidden, heads, batch, seq, vocab, bias, precision, recompute): 12 shapes, tiny so that the
# test stays fast; the first has its mixed-precision peak in the optimizer's step, the second in backward
GRID = [
    (*shape, precision, recompute)
    for shape in ((2, 16, 2, 2, 8, 7, True), (1, 16, 2, 8, 32, 7, False))
    for precision in ("fp32", "mixed")
    for recompute in ("none", "selective", "full")
]


def _config(L, h, a, b, s, V, precision, recompute) -> MemoryConfig:
    return MemoryConfig(
        layers=L,
        hidden=h,
        heads=a,
        vocab=V,
        seq=s,
        micro_batch=b,
        precision=precision,
        recompute=recompute,
        attention="flash",
        dropout=False,
        device="cpu",
    )


def test_peak_grid_within_5_percent_of_the_measured_peak():
    rows, phases = [], set()
    for L, h, a, b, s, V, bias, precision, recompute in GRID:
        got = measure_gpt_step(L, h, a, V, b, s, precision, recompute, bias=bias)
        want = predict_peak(_config(L, h, a, b, s, V, precision, recompute), bias=bias)
        error = want.peak_bytes / got.peak_bytes - 1
        rows.append((L, h, a, b, s, V, bias, precision, recompute, want.peak_bytes, got.peak_bytes, error))
        assert abs(error) <= 0.05, rows[-1]
        assert want.phase == got.peak_phase, rows[-1]
        # the parts at the peak: the same kinds as the measurement (recomputed tensors are temporaries there)
        measured = (
            got.peak_params_bytes,
            got.peak_grads_bytes,
            got.peak_optimizer_bytes,
            got.peak_activations_bytes,
            got.peak_temporary_bytes,
        )
        parts = want.parts
        predicted = (
            parts["params"],
            parts["grads"],
            parts["optimizer"],
            parts["activations"],
            parts["recomputed"] + parts["temporaries"],
        )
        for m, p in zip(measured, predicted, strict=True):
            assert abs(m - p) <= 0.05 * got.peak_bytes, (rows[-1], measured, predicted)
        phases.add(want.phase)
    assert len(rows) >= 12 and phases == {"backward", "optimizer"}


def test_the_sum_of_parts_misses_the_peak_and_says_why():
    """No recomputation: the estimator's total counts every gradient, which does not exist yet at the
    peak (too high); full recomputation: it leaves out the recomputed layer (too low)."""
    none = predict_peak(_config(2, 64, 4, 8, 32, 16, "fp32", "none"))
    full = predict_peak(_config(2, 64, 4, 8, 32, 16, "fp32", "full"))
    assert none.sum_of_parts_bytes > none.peak_bytes and none.parts["grads"] < none.parts["params"]
    assert full.sum_of_parts_bytes < full.peak_bytes and full.parts["recomputed"] > 0
    assert "backward" in none.where and full.phase == "backward"


def test_timeline_and_sizes():
    tl = Timeline()
    tl.alloc("a", 10, "activations")
    tl.alloc("b", 5)
    tl.free("a")
    tl.alloc("c", 7, "grads")
    assert (tl.peak, tl.current) == (15, 12) and tl.parts()["activations"] == 10
    with pytest.raises(ValueError, match="kind='weights' is not one of"):
        tl.alloc("d", 1, "weights")
    with pytest.raises(ValueError, match="tensor 'b' is already alive"):
        tl.alloc("b", 1)
    from distlab.models import GPT, GPTConfig

    for bias in (True, False):
        model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=bias))
        assert gpt_parameter_sizes(2, 32, 11, 16, bias) == [p.numel() for p in model.parameters()]
    assert set(predict_peak(_config(1, 32, 2, 2, 16, 11, "fp32", "none")).parts) == set(KINDS)


def test_peak_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="tp=2: the peak model follows the course's GPT step in one process"):
        predict_peak(
            MemoryConfig(layers=2, hidden=64, heads=4, vocab=16, tp=2, attention="flash", dropout=False)
        )
    with pytest.raises(ValueError, match="attention='math'"):
        predict_peak(MemoryConfig(layers=2, hidden=64, heads=4, vocab=16, dropout=False))
    with pytest.raises(ValueError, match="the peak needs the model's shape"):
        predict_peak(MemoryConfig(params=1e9))


def test_cli_measure_prints_predicted_beside_measured(capsys):
    main(
        [
            "measure",
            "--layers",
            "1",
            "--hidden",
            "32",
            "--heads",
            "2",
            "--batch",
            "2",
            "--seq",
            "1.6e1",
            "--precision",
            "mixed",
            "--recompute",
            "full",
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert data["predicted_peak_bytes"] == pytest.approx(data["measured_peak_bytes"], rel=0.05)
    assert data["predicted_peak_phase"] in ("forward", "backward", "optimizer")
    for kind in KINDS:
        assert f"predicted_peak_{kind}_bytes" in data
    assert "measured_peak_temporary_bytes" in data and "estimator_total_bytes" in data


def test_cli_estimate_says_when_no_shape_is_given(capsys):
    main(["estimate", "--params", "7.5e9"])
    out = capsys.readouterr().out
    assert "not estimated: no shape given" in out and "7.5e+09" in out
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: pp, one per stage)" in text
    with pytest.raises(SystemExit):
        main(["measure", "--help"])
    assert "Run one training step" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["estimate", "--params", "inf"], "argument --params: 'inf' is not a number"),
        (["estimate", "--params", "nan"], "argument --params: 'nan' is not a number"),
        (["estimate", "--params", "0"], "argument --params: 0 must be at least 1"),
        (["estimate", "--params", "-5"], "argument --params: -5 must be at least 1"),
        (["estimate", "--params", "1e30"], "argument --params: 1e30 must be at most 1e+15"),
        (["estimate", "--params", "1e9", "--dp", "1e9"], "argument --dp: 1e9 must be at most 1e+07"),
        (["estimate", "--params", "1e9", "--tp", "2.5"], "argument --tp: '2.5' is not a whole number"),
        (["estimate", "--params", "1e9", "--host-memory-gb", "0"], "argument --host-memory-gb: 0 must be"),
        (["estimate", "--params", "1e9", "--host-memory-gb", "inf"], "argument --host-memory-gb: 'inf'"),
        (["measure", "--hidden", "-1"], "argument --hidden: -1 must be at least 1"),
        (["measure", "--seq", "nan"], "argument --seq: 'nan' is not a whole number"),
        (["measure", "--batch", "1e9"], "argument --batch: 1e9 must be at most 1e+06"),
        (["measure", "--hidden", "100000"], "GB at its peak (predicted, optimizer) and this machine has"),
        (["measure", "--hidden", "30", "--heads", "4"], "hidden=30 is not divisible by heads=4"),
    ],
)
def test_cli_bad_sizes_are_one_line_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_sizes_take_e_notation(capsys):
    main(
        [
            "estimate",
            "--layers",
            "4",
            "--hidden",
            "6.4e1",
            "--heads",
            "4",
            "--vocab",
            "1e3",
            "--seq",
            "1e3",
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert data["shape_given"] and data["activations_bytes"] > 0


def test_peak_refuses_a_plan_it_does_not_model():
    with pytest.raises(ValueError, match="recomputing the MLP alone"):
        predict_peak(_config(2, 16, 2, 2, 8, 7, "fp32", "none"), plan=["mlp", "none"])
