"""The `distlab` command (`python -m distlab` too): every chapter's command listed and reachable, output
into a closed pipe ending quietly, and `distlab progress`, fed by the exercise checks' verdicts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from distlab import cli, progress
from distlab.checks import NOT_WRITTEN
from distlab.pipeline.exercises import check_one_f_one_b
from distlab.pipeline.schedules import one_f_one_b_order


def test_python_m_distlab_lists_every_chapters_command() -> None:
    out = subprocess.run([sys.executable, "-m", "distlab", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for command in ("doctor", "progress", "figures", *(c for c, _, _ in cli.CHAPTERS)):
        assert f"    {command}" in out, f"`distlab --help` does not list {command}:\n{out}"


def test_a_chapters_command_gets_the_rest_of_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["pipeline", "--help"])
    assert stop.value.code == 0 and "python -m distlab.pipeline" in capsys.readouterr().out


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """`distlab doctor --json | head`: the reader goes away before the report is written. (`progress`
    goes through the same `cli.main` and takes a fraction of doctor's probing time.)"""
    proc = subprocess.Popen([sys.executable, "-m", "distlab", "progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # head has read what it wanted
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def _wrong_warmup(p: int, m: int) -> list[list[tuple[str, int]]]:
    """1F1B with one warm-up forward too many on rank 0."""
    orders = [[(a.op, a.microbatch) for a in rank] for rank in one_f_one_b_order(p, m)]
    if p > 1 and m > p:
        first_b = next(i for i, a in enumerate(orders[0]) if a[0] == "B")
        f_after = next(i for i, a in enumerate(orders[0]) if a[0] == "F" and i > first_b)
        orders[0].insert(first_b, orders[0].pop(f_after))
    return orders


def _stub(p: int, m: int) -> None:
    raise NotImplementedError("Your turn")


def test_progress_records_each_checks_latest_verdict(tmp_path, monkeypatch, capsys) -> None:
    record = tmp_path / "progress.json"
    monkeypatch.setenv(progress.ENV, str(record))
    assert "check_one_f_one_b  not run yet" in progress.report("04")
    stub = check_one_f_one_b(_stub, run=False)
    assert str(stub) == f"check_one_f_one_b: {NOT_WRITTEN}", "a stub says 'not written' once"
    assert json.loads(record.read_text()) == {"check_one_f_one_b": "not written"}
    assert not check_one_f_one_b(_wrong_warmup, run=False)
    assert progress.load() == {"check_one_f_one_b": "fail"}
    assert check_one_f_one_b(lambda p, m: one_f_one_b_order(p, m), run=False)
    assert cli.main(["progress", "04"]) == 0
    out = capsys.readouterr().out
    assert "lab 04 (pipeline): 1 of 2 exercises pass" in out and "check_zb_h1_rank   not run yet" in out
    monkeypatch.setenv(progress.ENV, "off")
    check_one_f_one_b(_stub, run=False)
    assert progress.load(record) == {"check_one_f_one_b": "pass"}, "DISTLAB_PROGRESS=off records nothing"
    with pytest.raises(ValueError, match="lab='44' is not a lab"):
        monkeypatch.setenv(progress.ENV, str(record))
        progress.report("44")
