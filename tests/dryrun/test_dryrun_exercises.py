"""Lab 12's exercise check: the bytes rank 5 of Llama 3's 16K layout sends on the tp axis, checked
against dry runs of that rank; the student version's stub reads "not written yet"; progress lists lab 12."""

from __future__ import annotations

from distlab import progress
from distlab.checks import NOT_WRITTEN
from distlab.dryrun import from_published
from distlab.dryrun.exercises import check_tp_bytes

LAYOUT = from_published("llama3-405b-16k", layers=16, microbatches=4)  # one block per stage


def _solution(layout, rank):  # type: ignore[no-untyped-def]
    h, s, t, e = layout.config.n_embd, layout.seq, layout.plan.tp, 4
    b = layout.batch // (layout.plan.dp * layout.plan.m)
    per_micro_batch = (4 * 1 + 1) * b * s * h * e  # one block and the embedding on the first stage
    return layout.plan.m * per_micro_batch * 2 * (t - 1) / t


def _stub(layout, rank):  # type: ignore[no-untyped-def]
    raise NotImplementedError("Your turn: write this part (see the instructions above)")


def test_the_solution_passes_and_mistakes_are_named() -> None:
    assert check_tp_bytes(_solution, LAYOUT, 5)
    no_embedding = check_tp_bytes(lambda lay, r: _solution(lay, r) * 4 / 5, LAYOUT, 5)
    assert not no_embedding and "the first stage adds the embedding's" in str(no_embedding)
    copied = _solution(LAYOUT, 5)  # a number from one run does not pass the half-batch case
    result = check_tp_bytes(lambda lay, r: copied, LAYOUT, 5)
    assert [c.passed for c in result.cases] == [True, False], str(result)
    assert "return the bytes as a number" in str(check_tp_bytes(lambda lay, r: "18 GB", LAYOUT, 5))


def test_the_stub_is_not_written_yet_and_lab_12_is_listed() -> None:
    result = check_tp_bytes(_stub, LAYOUT, 5)
    assert not result and result.verdict == "not written" and str(result).count(NOT_WRITTEN) == 1
    assert progress.lab_exercises()["12_dry_runs"] == ["check_tp_bytes"]
