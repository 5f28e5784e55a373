"""`python -m distlab.dryrun --moe-published NAME --rank R [--savings ...]`: one rank of a judged MoE layout,
its whole step beside the models, a fits / does not fit verdict and the exit status, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from distlab.dryrun.__main__ import main
from distlab.dryrun.moe_report import parse_savings
from distlab.memory.estimate.moe_savings import DEEPSEEK_V3_SAVINGS, NONE, Savings


def test_a_stage_that_does_not_fit_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V3's stage 1 with nothing saved holds twice an H800's memory."""
    assert main(["--moe-published", "deepseek-v3", "--rank", "130", "--microbatches", "16"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("rank 130 of deepseek-v3: pipeline stage 1, 16 micro-batches under 1F1B, "
                          "15 in flight")
    assert "(tolerance 1%): ok" in out
    assert out.rstrip().endswith("of one H800's 80 GB (the H100's row): DOES NOT FIT")


def test_the_last_stage_fits_and_reports_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--moe-published", "deepseek-v3", "--rank", "2047", "--microbatches", "2",
                 "--savings", "recompute,fp8", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["stage"], got["fits"], got["gpu"]) == (15, True, "H800") and got["worst"] < 0.01
    rows = {what: (measured, model) for what, measured, model in got["rows"]}
    assert rows["sent pp activations"] == (0, 0)
    assert rows["sent pp gradients"] == (2 * 4096 * 7168 * 2,) * 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--moe-published", "nope"], "invalid choice: 'nope'"),
    (["--moe-published", "deepseek-v3", "--rank", "2048"],
     "--rank 2048 is not a rank of deepseek-v3's 2048 GPUs"),
    (["--moe-published", "deepseek-v3", "--savings", "fp16"], "--savings 'fp16': give none, recompute, fp8"),
    (["--moe-published", "bridge-deepseek-v3-h100", "--savings", "fp8"], "with tp=1"),
])
def test_bad_names_ranks_and_savings_name_the_fix(argv: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_parse_savings() -> None:
    assert parse_savings("none") == NONE and parse_savings("recompute, fp8") == DEEPSEEK_V3_SAVINGS
    assert parse_savings("fp8") == Savings(fp8=True)
    with pytest.raises(ValueError, match="give none"):
        parse_savings("none,fp8")


def test_python_m_dryrun_runs_a_moe_rank() -> None:
    argv = ["--moe-published", "bridge-qwen3-30b-a3b-h100", "--rank", "15", "--microbatches", "2"]
    out = subprocess.run([sys.executable, "-m", "distlab.dryrun", *argv], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "rank 15 of bridge-qwen3-30b-a3b-h100: pipeline stage 1" in out.stdout
    assert out.stdout.rstrip().endswith("of one H100's 80 GB: fits")
