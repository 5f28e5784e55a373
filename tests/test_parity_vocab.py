"""The parity vocabulary (`distlab.parity`): one tolerance table, one comparison, one report, one verdict.

Pure Python, no ranks. The verdict must be the same sentence on every machine, so the tests check its
exact words; the differences are made with known sizes (1e-12, 1e-3) far from the tolerances.
"""

from __future__ import annotations

import math

import pytest
import torch

from distlab import parity
from distlab.parity import TOLERANCE, ParityReport, compare


def named_grads(n: int, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(3, 2, generator=g, dtype=dtype) for i in range(n)}


def test_tolerance_table_covers_the_course_dtypes_in_order_of_precision():
    assert list(TOLERANCE) == [torch.float64, torch.float32, torch.float16, torch.bfloat16]
    tols = list(TOLERANCE.values())
    assert tols == sorted(tols)
    for dtype, tol in TOLERANCE.items():  # far above the unit roundoff, far below a real bug (1e-1)
        assert torch.finfo(dtype).eps < tol < 0.1


def test_verdict_names_the_families_and_counts_members():
    grads = named_grads(38)
    logits = torch.randn(2, 5, dtype=torch.float64)
    ours = {"logits": logits + 1e-12, "loss": 2.5, "gradients": {k: v + 1e-12 for k, v in grads.items()}}
    ref = {"logits": logits, "loss": 2.5, "gradients": grads}
    report = compare(ours, ref, dtype=torch.float64)
    assert report.passed and bool(report)
    assert report.tolerance == 1e-10 and report.dtype == torch.float64
    assert report.verdict() == "logits, loss and all 38 gradients agree within 1e-10: ok"
    assert report.worst() < 1e-10
    assert set(report.differences) == {"logits", "loss", "gradients"}
    assert len(report.differences["gradients"]) == 38


def test_dtype_is_taken_from_ours_and_picks_the_tolerance():
    a = torch.ones(4, dtype=torch.float32)
    assert compare(a, a).tolerance == TOLERANCE[torch.float32]
    mixed = {"fp32": a, "bf16": a.bfloat16()}
    assert compare(mixed, mixed).dtype == torch.bfloat16
    assert compare(a, a, tol=1e-3).tolerance == 1e-3
    assert compare(a.half(), a.double()).verdict() == "output agrees within 0.01: ok"


def test_failure_names_what_failed_without_numbers():
    grads = named_grads(3)
    ours = {"loss": 1.0, "gradients": dict(grads)}
    ours["gradients"]["layer1.weight"] = grads["layer1.weight"] + 1e-3
    report = compare(ours, {"loss": 1.0, "gradients": grads}, dtype=torch.float64, label="tp=2")
    assert not report.passed
    assert report.verdict() == ("tp=2: loss and all 3 gradients agree within 1e-10: FAILED for "
                                "gradients[layer1.weight]")
    assert report.failures() == ["gradients[layer1.weight]"]
    assert report.worst_name() == "gradients[layer1.weight]"
    assert math.isclose(report.worst(), 1e-3, rel_tol=1e-6)
    with pytest.raises(AssertionError, match=r"max \|diff\| 1\.00e-03 at gradients\[layer1\.weight\]"):
        report.assert_passed()


def test_nan_fails_unless_both_sides_have_it_and_equal_nan_is_asked():
    a = torch.tensor([1.0, math.nan], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    report = compare(a, b)
    assert math.isnan(report.worst()) and not report.passed
    assert report.verdict() == "output agrees within 1e-10: FAILED for output"
    assert not compare(a, a).passed  # a nan is not a number: no agreement by default
    assert compare(a, a, equal_nan=True).passed
    assert not compare(a, b, equal_nan=True).passed
    assert not compare(math.nan, 1.0, dtype=torch.float64, name="loss").passed


def test_sequences_are_loss_curves():
    curve = [2.3, 2.1, 1.9]
    report = compare([x + 1e-7 for x in curve], curve, dtype=torch.float32, name="losses")
    assert report.verdict() == "all 3 losses agree within 1e-05: ok"
    assert report.flat().keys() == {"losses[0]", "losses[1]", "losses[2]"}
    with pytest.raises(ValueError, match=r"losses: a sequence of 2 here but a sequence of 3 in the "):
        compare(curve[:2], curve, dtype=torch.float32, name="losses")


def test_shape_mismatch_names_the_key():
    grads = named_grads(2)
    bad = dict(grads, **{"layer1.weight": torch.zeros(2, 3, dtype=torch.float64)})
    with pytest.raises(ValueError, match=r"gradients\[layer1\.weight\]: shape \(2, 3\) here but \(3, 2\) in "
                                         r"the reference; compare the same tensor"):
        compare({"gradients": bad}, {"gradients": grads})


def test_missing_and_extra_keys_are_named():
    grads = named_grads(3)
    fewer = {k: v for k, v in grads.items() if k != "layer2.weight"}
    with pytest.raises(ValueError, match=r"gradients: the keys differ: missing here \['layer2.weight'\], "
                                         r"not in the reference \[\]"):
        compare({"gradients": fewer}, {"gradients": grads})
    more = dict(grads, extra=torch.zeros(1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^the keys differ: missing here \[\], not in the reference "
                                         r"\['extra'\]"):
        compare(more, grads)
    with pytest.raises(ValueError, match="a dict here but a tensor of shape"):
        compare(grads, torch.zeros(1))


def test_dtype_must_be_known():
    with pytest.raises(ValueError, match=r"dtype=None\) found no floating-point tensor .* pass dtype="):
        compare(1.0, 1.0)
    with pytest.raises(ValueError, match=r"dtype=torch.int64 has no tolerance .* pass tol="):
        compare(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), dtype=torch.int64)
    assert compare(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), tol=0).passed


def test_merge_takes_the_worst_over_ranks_and_keeps_extras():
    x = torch.zeros(3, dtype=torch.float64)
    r0 = compare({"out": x + 1e-13}, {"out": x}, label="rank 0")
    r1 = compare({"out": x + 1e-3}, {"out": x}, label="rank 1")
    both = parity.merge([r0, r1], label="2 ranks")
    assert not both.passed and both.verdict() == "2 ranks: out agrees within 1e-10: FAILED for out"
    routed = ParityReport({"out": {"out": 0.0}}, 1e-10, torch.float64, "rank 2", extra=["routing"])
    assert parity.merge([r0, routed]).failures() == ["routing"]
    with pytest.raises(ValueError, match="reports is empty"):
        parity.merge([])
    with pytest.raises(ValueError, match="compared different things"):
        parity.merge([r0, compare({"other": x}, {"other": x})])


def test_a_state_dict_is_one_family_when_named():
    grads = named_grads(6, torch.float32)
    report = compare(grads, grads, name="parameters", label="p = 2", against="one process")
    assert report.verdict() == "p = 2: all 6 parameters agree with one process within 1e-05: ok"
    assert list(report.flat())[0] == "parameters[layer0.weight]"


def test_a_one_member_family_is_named_with_its_member():
    report = compare({"gradients": {"w": torch.ones(1)}}, {"gradients": {"w": torch.ones(1)}})
    assert report.verdict() == "gradients (w) agree within 1e-05: ok"
    assert compare({"logits": torch.ones(1)}, {"logits": torch.ones(1)}).verdict().startswith("logits agree ")
