"""Chapter 9's memory is chapter 7's: for every pinned configuration both command lines accept, `python -m
distlab.plan --json`'s `memory_gb` is `python -m distlab.memory estimate --json`'s `peak_bytes` (the
step's peak on the GPU that holds the most), on a grid of layouts, ZeRO stages, recomputations,
micro-batches, interleavings and Adam implementations; and `plan --micro-batch` holds in search mode."""

from __future__ import annotations

import itertools
import json

import pytest

from distlab.memory.__main__ import main as memory_main
from distlab.plan.__main__ import main as plan_main

SHAPE = {"layers": 8, "hidden": 512, "heads": 8, "vocab": 1000, "seq": 1024}  # a 25M-parameter GPT
BATCH = 64


def _grid():
    """(dp, tp, pp, cp) on 16 GPUs (2 servers), each with ZeRO stages it allows, every recomputation,
    micro-batch 1 or 2, v 1 or 2 (with a pipeline), Adam default or fused."""
    layouts = [(16, 1, 1, 1), (4, 4, 1, 1), (2, 2, 4, 1), (2, 1, 2, 4), (1, 4, 2, 2), (4, 2, 2, 1)]
    for (dp, tp, pp, cp), recompute, b, adam in itertools.product(
            layouts, ("none", "selective", "full"), (1, 2), ("default", "fused")):
        for zero in ((0, 1) if pp > 1 else (0, 1, 2, 3)):
            for v in ((1, 2) if pp > 1 else (1,)):
                if zero and dp * cp == 1:
                    continue
                yield dp, tp, pp, cp, zero, recompute, b, v, adam


def _plan(capsys, dp, tp, pp, cp, zero, recompute, b, v, adam) -> dict:
    argv = [f"--{k}={x}" for k, x in SHAPE.items()] + [
        "--nodes", "2", "--batch", str(BATCH), "--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--cp",
        str(cp), "--zero", str(zero), "--recompute", recompute, "--micro-batch", str(b), "--interleave",
        str(v), "--adam", adam, "--json"]
    plan_main(argv)
    return json.loads(capsys.readouterr().out)


def _estimate(capsys, dp, tp, pp, cp, zero, recompute, b, v, adam) -> dict:
    """The same configuration as the planner describes it to chapter 7 (`candidates.memory_config`): the
    ZeRO group is dp x cp, sequence parallelism with tp, flash attention, no dropout, 1F1B or interleaved,
    m = B / (d b) micro-batches, on a GPU."""
    argv = ["estimate"] + [f"--{k}={x}" for k, x in SHAPE.items()] + [
        "--dp", str(dp * cp), "--tp", str(tp), "--pp", str(pp), "--cp", str(cp), "--zero", str(zero),
        "--recompute", recompute, "--micro-batch", str(b), "--microbatches", str(BATCH // (dp * b)),
        "--schedule", "interleaved" if v > 1 else "1f1b", "--interleave", str(v), "--attention", "flash",
        "--no-dropout", "--adam", adam, "--device", "cuda", "--json"] + (
        ["--sequence-parallel"] if tp > 1 else [])
    memory_main(argv)
    return json.loads(capsys.readouterr().out)


def test_plan_memory_gb_is_the_estimators_peak_on_a_grid(capsys) -> None:
    rows, phases = 0, set()
    for config in _grid():
        plan, est = _plan(capsys, *config), _estimate(capsys, *config)
        assert plan["memory_gb"] * 1e9 == pytest.approx(est["peak_bytes"], rel=1e-12), config
        assert plan["memory"]["peak_bytes"] == est["peak_bytes"] and plan["peak_bytes"] == est["peak_bytes"]
        assert plan["memory"]["total_bytes"] == est["total_bytes"], config  # and the sum of parts beside it
        assert plan["fits"] == (est["peak_bytes"] <= 0.9 * 80e9)
        rows += 1
        phases.add(est["peak_phase"])
    assert rows >= 150 and phases == {"backward", "optimizer"}


def test_plan_micro_batch_is_honoured_in_search_mode(capsys) -> None:
    argv = [f"--{k}={x}" for k, x in SHAPE.items()] + ["--batch", str(BATCH), "--json"]
    assert plan_main([*argv, "--micro-batch", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kept"] > 0 and {c["micro_batch"] for c in out["candidates"]} == {4}
    assert plan_main([*argv, "--micro-batch", "3"]) == 1  # 3 divides no replica's share of 64
    assert "micro-batch does not divide" in json.dumps(json.loads(capsys.readouterr().out)["removed"])
    for bad, message in (("1e30", "micro_batch=1000000000000000019884624838656 is beyond any real"),
                         ("0", "must be at least 1")):
        with pytest.raises(SystemExit):
            plan_main([*argv, "--micro-batch", bad])
        assert message in capsys.readouterr().err
