"""Chapter 9's planner (pure Python, no ranks): the search space, the memory filter against chapter 7's
estimator, the step-time terms, the published runs, and the command line."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distlab.memory.estimate import shape
from distlab.memory.estimate.estimator import estimate
from distlab.pipeline.cost_model import bubble_fraction
from distlab.plan import (
    PRESETS,
    RUNS,
    Candidate,
    ClusterSpec,
    ModelSpec,
    Settings,
    Workload,
    enumerate_candidates,
    evaluate,
    explain,
    judge,
    plan,
    preset,
    step_time,
)
from distlab.plan.__main__ import main
from distlab.plan.candidates import check_fits_grid, memory_config
from distlab.plan.cost_model import model_flops, recompute_flops
from distlab.plan.inputs import HBM_GB
from distlab.plan.planner import Row
from distlab.plan.published import lookup
from distlab.plan.report import published_markdown
from distlab.topology import Latencies

SMALL = ModelSpec(6, 96, 6, 500, 30, name="small")  # heads, layers and seq divisible by 2 and 3, not 4


def _check_rules(model: ModelSpec, cluster: ClusterSpec, workload: Workload, c: Candidate) -> None:
    check_fits_grid(model, cluster, workload, c)  # raises on any broken rule
    assert not (c.zero > 0 and c.dp * c.cp == 1) and not (c.zero > 1 and c.pp > 1)  # ZeRO shards over d c
    assert c.interleave == 1 or (c.pp > 1 and c.microbatches(workload.batch) % c.pp == 0)


@pytest.mark.parametrize("gpus", [1, 2, 3, 4])
def test_enumeration_obeys_the_rules_on_1_to_4_gpus(gpus: int) -> None:
    cluster, workload = ClusterSpec("A100", 1, gpus), Workload(12)
    cands = list(enumerate_candidates(SMALL, cluster, workload))
    assert cands
    for c in cands:
        _check_rules(SMALL, cluster, workload, c)
    sizes = {(c.dp, c.tp, c.pp, c.cp) for c in cands}
    if gpus == 4:  # 4 divides neither the heads nor the sequence; the 6 layers split unevenly over 4 stages
        assert all(4 not in (tp, cp) for _, tp, _, cp in sizes) and (1, 1, 4, 1) in sizes
        assert shape.stage_layers(6, 4) == (1, 2, 2, 1)
        assert (4, 1, 1, 1) in sizes and (1, 2, 2, 1) in sizes and (2, 1, 1, 2) in sizes
    if gpus == 3:
        assert {(1, 3, 1, 1), (1, 1, 3, 1), (1, 1, 1, 3), (3, 1, 1, 1)} <= sizes


def test_enumeration_across_servers_keeps_tp_inside_one() -> None:
    cluster, workload = ClusterSpec("H100", 3, 4), Workload(24)  # 12 GPUs, servers of 4
    cands = list(enumerate_candidates(SMALL, cluster, workload))
    assert {c.tp for c in cands} == {1, 2, 3, 6}  # 6 spans two servers (priced there); 4 does not divide 6
    across = step_time(SMALL, cluster, workload, Candidate(2, 6, 1, 1, 0, "none", 1))
    inside = step_time(SMALL, ClusterSpec("H100", 3, 4, inter_GBps=450.0,
                                          latencies=Latencies(network=1e-6)), workload,
                       Candidate(2, 6, 1, 1, 0, "none", 1))
    assert across.tp > 5 * inside.tp  # the tp=6 ring crosses the network, at a ninth of NVLink's rate
    assert any(c.interleave == 2 for c in cands) and any(c.zero == 3 for c in cands)
    assert {c.cp for c in enumerate_candidates(SMALL, cluster, workload, max_cp=2)} == {1, 2}
    for c in cands:
        _check_rules(SMALL, cluster, workload, c)
    assert len(cands) == len(set(cands))


def test_memory_filter_is_chapter_7s_estimator() -> None:
    model, cluster, workload = preset("gpt3-175b"), ClusterSpec("A100", 8), Workload(64)
    settings = Settings()
    rows = evaluate(model, cluster, workload, settings, recomputes=("none", "full"), interleaves=(1,))
    assert any(r.fits for r in rows) and any(not r.fits for r in rows)
    for r in rows:
        e = estimate(memory_config(model, workload, r.candidate, settings, cluster.gpus_per_node))
        assert r.memory.peak_bytes == e.peak_bytes and r.memory.total_bytes == e.total_bytes
        assert r.fits == (e.peak_bytes <= 0.9 * 80e9)
    kept = plan(model, cluster, workload, settings, recomputes=("none", "full"), interleaves=(1,))
    assert [r.candidate for r in kept] == [r.candidate for r in sorted(
        (r for r in rows if r.fits), key=lambda r: (round(r.time.total, 9), r.memory.peak_bytes,
                                                   r.candidate.label()))]
    # 175B x 16 bytes of model states = 2.8 TB: replicated (no tp, pp or ZeRO) it fits nowhere
    assert not any(r.candidate.pp * r.candidate.tp == 1 and r.candidate.zero == 0 for r in kept)


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_published_runs_are_feasible_and_plausible(run) -> None:
    assert run.tp * run.pp * run.dp * run.cp == run.gpus
    assert run.batch % run.dp == 0
    j = judge(run)
    hbm = 80e9
    assert j["hbm_bytes"] == hbm and j["fits"]
    assert 15e9 < j["peak_bytes"] < 0.9 * hbm  # fills a good part of the GPU, leaves >= 8 GB spare
    assert j["headroom_bytes"] > 8e9
    peak = {"A100": 312, "H100": 989.4}[run.gpu]
    assert run.tflops < 0.6 * peak
    assert 0.4 * run.tflops < j["predicted_tflops_per_gpu"] < 1.2 * run.tflops
    assert 0.3 < j["implied_efficiency"] < 1.0  # the reported speed needs a plausible kernel efficiency


def test_llama_fits_without_recomputation_only_with_its_shorter_rounds() -> None:
    """Llama 3 trains its 8K stage without activation checkpointing (Dubey et al. 2024, sec. 3.3.2): under
    the estimator that fits with its interleaved schedule's rounds of N = 5 micro-batches, not with
    Megatron-LM's N = p."""
    for run in RUNS:
        if run.name.startswith("llama3"):
            assert run.recompute == "none" and judge(run)["fits"]
            rounds_p = dataclasses.replace(run, settings=dataclasses.replace(run.settings, rounds=None))
            assert not judge(rounds_p)["fits"]


def test_published_table_matches_the_papers() -> None:
    mt = lookup("megatron-1t")
    assert (mt.model_spec().layers, mt.model_spec().hidden, mt.model_spec().heads) == (128, 25600, 160)
    assert mt.model_spec().params == pytest.approx(1008e9, rel=0.01)  # Table 1: 1008.0 billion
    assert lookup("megatron-530b").model_spec().params == pytest.approx(529.6e9, rel=0.01)
    assert lookup("megatron-146b").model_spec().params == pytest.approx(145.6e9, rel=0.01)
    assert lookup("megatron-310b").model_spec().params == pytest.approx(310.1e9, rel=0.01)
    for name in ("llama3-405b-8k", "llama3-405b-16k", "llama3-405b-128k"):
        r = lookup(name)
        assert r.batch * r.model_spec().seq == 16 * 2**20  # 16M tokens per batch
        assert r.tflops / 989.4 == pytest.approx(r.mfu, abs=0.01)  # TFLOPs/GPU and MFU agree
    assert preset("llama3-405b").params == pytest.approx(405e9, rel=0.05)
    bib = (Path(__file__).parents[2] / "book" / "references.bib").read_text()
    keys = set(re.findall(r"^@\w+\{([^,]+),", bib, re.M))
    assert {r.source for r in RUNS} | {src for _, src, _ in HBM_GB.values()} <= keys
    assert {"nvidia2021megatronlm", "bigscience2022tr11"} <= keys  # the layouts' sources (published.py)
    # As re-read: Narayanan et al. 2021, Table 1 (t, p, GPUs, batch, TFLOP/s per GPU); Megatron-LM's GPT-3
    # example; Llama 3's Table 4 (its 128K row's DP = 4 is a misprint, see published.py); BLOOM's tr11 setup.
    table_1 = {"megatron-146b": (8, 8, 1536, 2304, 148), "megatron-310b": (8, 16, 1920, 2160, 155),
               "megatron-530b": (8, 35, 2520, 2520, 163), "megatron-1t": (8, 64, 3072, 3072, 163),
               "gpt3-175b": (8, 16, 1024, 1536, 140)}
    for name, row in table_1.items():
        r = lookup(name)
        assert (r.tp, r.pp, r.gpus, r.batch, r.tflops) == row and r.micro_batch == 1
    for name, (tp, cp, pp, dp, per_dp) in {"llama3-405b-8k": (8, 1, 16, 64, 32),
                                           "llama3-405b-16k": (8, 1, 16, 128, 16),
                                           "llama3-405b-128k": (8, 16, 16, 8, 16)}.items():
        r = lookup(name)
        assert (r.tp, r.cp, r.pp, r.dp, r.batch // r.dp) == (tp, cp, pp, dp, per_dp)
    b = lookup("bloom-176b")
    assert (b.tp, b.pp, b.dp, b.micro_batch, b.batch, b.zero) == (4, 12, 8, 2, 2048, 1)
    assert shape.stage_layers(70, 12) == (5,) + (6,) * 10 + (5,)  # tr11: 5 blocks + embedding at each end
    md = published_markdown()
    assert md.count("\n") == len(RUNS) + 1 and "{cite}`dubey2024llama3`" in md
    with pytest.raises(ValueError, match="published='gpt5' is unknown; choose one of megatron-146b"):
        lookup("gpt5")


def test_flops_follow_narayanan_eq_3() -> None:
    m, batch = preset("megatron-1t"), 3072
    b, s, h, lyr, v = batch, m.seq, m.hidden, m.layers, m.vocab
    eq3 = 96 * b * s * lyr * h * h * (1 + s / (6 * h) + v / (16 * lyr * h))
    assert model_flops(m, batch) + recompute_flops(m, batch, "full") == pytest.approx(eq3, rel=1e-12)
    assert recompute_flops(m, batch, "none") == 0
    assert 0 < recompute_flops(m, batch, "selective") < recompute_flops(m, batch, "full")


def _terms(cluster: ClusterSpec, c: Candidate, efficiency: float = 0.5, overlap: bool = False):
    return step_time(preset("gpt3-175b"), cluster, Workload(64, efficiency), c, Settings(overlap_dp=overlap))


def test_step_terms_scale_with_their_resource() -> None:
    zero = Latencies(nvlink=0.0, pcie=0.0, network=0.0)
    base = ClusterSpec("A100", 4, latencies=zero)
    c = Candidate(dp=4, tp=8, pp=1, cp=1, zero=1, recompute="full", micro_batch=2)
    t1 = _terms(base, c)
    t2 = _terms(ClusterSpec("A100", 4, inter_GBps=50.0, latencies=zero), c)  # catalog: 25 GB/s per GPU
    assert t1.dp > 0 and t2.dp == pytest.approx(t1.dp / 2, rel=1e-12)
    assert (t2.compute, t2.tp, t2.pp) == (t1.compute, t1.tp, t1.pp)
    t3 = _terms(ClusterSpec("A100", 4, intra_GBps=600.0, latencies=zero), c)  # catalog: 300 GB/s
    assert t3.tp == pytest.approx(t1.tp / 2, rel=1e-12) and t3.dp == t1.dp
    t4 = _terms(base, c, efficiency=1.0)
    assert t4.compute == pytest.approx(t1.compute / 2) and t4.recompute == pytest.approx(t1.recompute / 2)
    p = Candidate(dp=2, tp=4, pp=4, cp=1, zero=0, recompute="none", micro_batch=2, interleave=2)
    tp_ = _terms(base, p)
    f = bubble_fraction(4, 16, 2)  # at least chapter 4's bubble; more for the output layer's last stage
    busy = tp_.compute + tp_.tp
    assert f <= tp_.bubble / (tp_.bubble + busy) < f + 0.05
    assert tp_.pp > 0 and tp_.cp == 0 and tp_.total == pytest.approx(sum(tp_.to_dict()[k] for k in (
        "compute", "recompute", "bubble", "tp", "pp", "cp", "dp")))


def test_zero_stages_price_their_collectives() -> None:
    cluster = ClusterSpec("A100", 2)
    t = {z: _terms(cluster, Candidate(16, 1, 1, 1, z, "full", 1)).dp for z in range(4)}
    assert t[0] == pytest.approx(t[1]) and t[0] < t[2] < t[3]  # m = 4 reduce-scatters, then gathers too
    cp = _terms(ClusterSpec("A100", 2), Candidate(2, 4, 1, 2, 0, "none", 1))
    assert cp.cp > 0


def test_explain_names_the_differences() -> None:
    run = lookup("megatron-1t")
    model, cluster, workload = run.model_spec(), run.cluster(), run.workload()
    rows = plan(model, cluster, workload, run.settings, zero_stages=(0,), recomputes=("full", "selective"),
                interleaves=(1,), max_micro_batch=2)
    lines = explain(rows[0], run)
    assert lines[-1].startswith("predicted step:")
    assert any(line.startswith(("dp: planner", "pp: planner", "cp: planner")) for line in lines)
    same = Row(run.candidate(), estimate(memory_config(model, workload, run.candidate(), run.settings)),
               True, step_time(model, cluster, workload, run.candidate(), run.settings))
    assert explain(same, run) == ["the planner's first choice is the published configuration"]


@pytest.mark.parametrize("make, message", [
    (lambda: ModelSpec(2, 100, 3, 10, 8), "hidden=100 is not divisible by heads=3"),
    (lambda: ModelSpec(0, 96, 6, 10, 8), "model layers=0 must be a positive integer, e.g. --layers 8"),
    (lambda: ModelSpec(2, 96, 6, 10, 8, kv_heads=4), "kv_heads=4 must be a positive integer that divides"),
    (lambda: ClusterSpec("B300"), "gpu='B300' is not in the planner's table; choose one of V100, A100"),
    (lambda: ClusterSpec("A100", 0), "cluster nodes=0 must be a positive integer, e.g. --nodes 8"),
    (lambda: ClusterSpec("A100", inter_GBps=-1.0), "inter_GBps=-1.0 must be a positive number"),
    (lambda: Workload(0), "batch=0 must be a positive integer number of sequences"),
    (lambda: Workload(8, 1.5), r"efficiency=1.5 must be in \[0.01, 1\]"),
    (lambda: Settings(usable_memory=0), r"usable_memory=0 must be in \(0, 1\]"),
    (lambda: preset("gpt9"), "preset='gpt9' is unknown; choose one of tiny"),
    (lambda: check_fits_grid(SMALL, ClusterSpec("A100", 1, 4), Workload(8), Candidate(1, 4, 1, 1, 0,
                                                                                    "none", 1)),
     "tp=4 does not divide heads=6"),
    (lambda: check_fits_grid(SMALL, ClusterSpec("A100", 1, 4), Workload(8), Candidate(2, 1, 1, 1, 0,
                                                                                    "none", 1)),
     r"dp\*tp\*pp\*cp = 2 but the cluster has 4 GPUs"),
    (lambda: check_fits_grid(SMALL, ClusterSpec("A100", 1, 3), Workload(2), Candidate(3, 1, 1, 1, 0,
                                                                                    "none", 1)),
     r"dp\*micro_batch = 3 exceeds batch=2"),
])
def test_bad_input_names_the_parameter_and_the_fix(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_presets_and_their_sizes() -> None:
    assert {"tiny", "gpt3-175b", "megatron-1t", "llama3-405b"} <= set(PRESETS)
    assert preset("gpt3-175b").params == pytest.approx(175e9, rel=0.01)
    assert all(p.name == name for name, p in PRESETS.items())


@pytest.mark.parametrize("argv, message", [
    ([], "give --preset NAME, --published NAME, or all of --layers"),
    (["--preset", "tiny", "--gpu", "TPU"], "argument --gpu: invalid choice: 'TPU'"),
    (["--preset", "tiny", "--explain"], "--explain compares with a published run"),
    (["--layers", "2", "--hidden", "100", "--heads", "3", "--vocab", "8", "--seq", "8"],
     "hidden=100 is not divisible by heads=3"),
    (["--preset", "tiny", "--zero", "5"], "--zero 5 is not a ZeRO stage"),
    (["--preset", "tiny", "--batch", "0"], "argument --batch: 0 must be at least 1"),
    (["--preset", "tiny", "--max-cp", "0"], "argument --max-cp: 0 must be at least 1"),
    (["--preset", "tiny", "--published", "megatron-1t"], "brings its own model; drop --preset"),
])
def test_cli_errors_are_usage_errors(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_cli_table_and_explain(capsys) -> None:
    assert main(["--preset", "tiny", "--nodes", "1", "--batch", "16", "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tiny on 8 A100 (1 servers x 8), batch 16 sequences") and len(out) == 7
    assert out[1].startswith("  model: 0.003553B parameters: 4 blocks of h=256") and "seconds" in out[2]


def test_cli_json_schema_in_a_subprocess() -> None:
    argv = [sys.executable, "-m", "distlab.plan", "--json", "--published", "llama3-405b-128k", "--explain",
            "--zero", "1", "--recompute", "full", "--interleave", "1", "4", "--max-micro-batch", "1"]
    out = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    top = {"model", "cluster", "batch", "assumptions", "kept", "candidates", "published", "explain"}
    assert top <= set(out)
    assert out["cluster"]["gpus"] == 16384 and out["kept"] == len(out["candidates"]) > 0
    assert out["assumptions"]["overlap"].startswith("dp overlaps")
    for c in out["candidates"]:
        dims = {"dp", "tp", "pp", "cp", "zero", "recompute", "micro_batch", "interleave", "peak_bytes"}
        assert dims <= set(c)
        assert set(c["time"]) >= {"compute", "recompute", "bubble", "tp", "pp", "cp", "dp", "total"}
        assert c["dp"] * c["tp"] * c["pp"] * c["cp"] == 16384 and c["peak_bytes"] <= 0.9 * 80e9
        assert math.isclose(c["time"]["total"], sum(c["time"][k] for k in (
            "compute", "recompute", "bubble", "tp", "pp", "cp", "dp")))
    times = [c["time"]["total"] for c in out["candidates"]]
    assert times == sorted(times)
    pub = out["published"]
    assert pub["fits"] and (pub["tp"], pub["cp"], pub["pp"], pub["dp"]) == (8, 16, 16, 8)
    assert out["explain"] and isinstance(out["explain"][0], str)


def test_exercise_check_accepts_the_solution_and_explains_a_wrong_answer() -> None:
    from distlab.plan.exercises import check_dp_term

    def solution(n, p, zero, m, alpha, gbps):
        if p == 1:
            return 0.0
        half = (p - 1) * (alpha + n / p * 1e-9 / gbps)  # one reduce-scatter, or one all-gather
        return {0: 2 * half, 1: 2 * half, 2: (m + 1) * half, 3: 3 * m * half}[zero]

    assert check_dp_term(solution)
    wrong = check_dp_term(lambda n, p, zero, m, alpha, gbps: 2 * (p - 1) * (alpha + n / p * 1e-9 / gbps))
    assert not wrong and "ZeRO 2 and 3 reduce-scatter every micro-batch" in str(wrong)


def test_the_chapter_prints_the_tables_from_the_data() -> None:
    from distlab.plan.report import judged_markdown

    chapter = (Path(__file__).parents[2] / "book" / "09-putting-it-together.md").read_text()
    assert published_markdown() in chapter and judged_markdown() in chapter


def test_figures_draw_from_the_planner() -> None:
    from distlab.plan.figures import candidates_figure, published_terms_figure

    run = lookup("llama3-405b-8k")
    rows = evaluate(run.model_spec(), run.cluster(), run.workload(), run.settings, zero_stages=(1,),
                    recomputes=("none", "full"), interleaves=(4,), max_cp=1)
    fig = candidates_figure("llama3-405b-8k", rows=rows)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert {"fits", "does not fit", "published (Table 4)"} <= set(labels)
    assert "planner: dp64 tp8 pp16 cp1 z1 none b1 v4" in labels  # the published configuration wins here
    fig = published_terms_figure("megatron-1t")
    assert len(fig.axes[0].patches) == 3 * 7  # three bars of seven terms
