"""Chapter 4 on real ranks: every schedule (the zero-bubble ZB-H1 and ZB-V included) against
single-process training on the whole world (1 to 4 ranks) and on the pipeline dim of a 2 x 2 mesh, the
GPT with its tied embedding, the exercise's check, and the command line.

Parity tolerance: float32's in `distlab.parity.TOLERANCE`, 1e-5: a pipeline sums each parameter's
gradient over m microbatches instead of over the whole batch at once, which only re-associates a float32
sum of at most 48 terms of size ~1 (relative error ~ 48 * 6e-8 < 1e-5); the observed differences are
~1e-8. No test asserts on timings. A hang would be ended by the launcher's timeout (30 s per receive).
"""

from __future__ import annotations

import functools

import pytest
import torch

from distlab import launch
from distlab.mesh import layout
from distlab.models import CharTokenizer, GPTConfig, char_corpus, get_batch, regression_data
from distlab.pipeline.cost_model import predicted_peak_stash
from distlab.pipeline.parity import merge, step_parity
from distlab.pipeline.train import reference_step, steps_on_rank

SIZES = [8, 32, 32, 32, 32, 4]  # 9 layers: up to 4 ranks x 2 chunks


def _gpt_problem():
    text = char_corpus(200)
    tok = CharTokenizer(text)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=4, n_head=2, n_embd=32)
    idx, targets = get_batch(tok.encode(text), 16, 12, torch.Generator().manual_seed(0))
    return config, idx, targets


def _schedule_configs(p: int) -> list[tuple[str, int, int]]:
    ms = [1, 2, 3, 4, 6] if p < 4 else [1, 3, 4, 6]  # m < p, m not a multiple of p, m > p
    configs = [("naive", 1, 1)] + [(n, m, 1) for n in ("gpipe", "1f1b") for m in ms]
    configs += [("interleaved", m, 2) for m in (p, 2 * p) if 24 % m == 0 and 2 * p <= 9]
    return configs + [("zbh1", m, 1) for m in ms] + [("zbv", m, 2) for m in (1, 3, 8)]  # zbv: m < and >= 2p-1


GPT_CONFIGS = [("gpipe", 4, 1), ("1f1b", 2, 1), ("interleaved", 3, 2), ("zbh1", 4, 1)]  # 6 layers = 3 x 2


def _every_run(p: int, X, y, config, idx, targets) -> dict:
    """Inside a rank: everything this file runs on `p` ranks, in one launch (a launch costs seconds): every
    schedule on the whole world; on 2 ranks the MESH_* steps on the world, on 4 ranks the same on the pp
    dim of a (dp=2, pp=2) mesh; on 3 ranks the GPT_CONFIGS of the tied-embedding GPT."""
    out = {"schedules": steps_on_rank(_schedule_configs(p), SIZES, X, y)}
    if p in (2, 4):
        out["mesh"] = _steps(X, y, config, idx, targets, on_mesh=p == 4)
    if p == 3:
        out["gpt"] = _gpt_steps(config, idx, targets, GPT_CONFIGS)
    return out


@functools.cache
def _ranks(p: int) -> list[dict]:
    X, y = regression_data(24, 8, 4, seed=0)
    return launch.run(_every_run, p, p, X, y, *_gpt_problem())


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_every_schedule_matches_single_process_training(p: int) -> None:
    X, y = regression_data(24, 8, 4, seed=0)
    configs = _schedule_configs(p)
    results = [r["schedules"] for r in _ranks(p)]
    reference = reference_step(SIZES, X, y)
    for k, (name, m, v) in enumerate(configs):
        parity = step_parity(merge([r[k] for r in results]), reference)
        assert parity, (name, m, v, str(parity))
        stash = tuple(r[k].run.peak_stash for r in results)
        assert stash == predicted_peak_stash(name, p, m, v), (name, m, v)
        assert all(r[k].run.peak_stash_bytes > 0 for r in results)


MESH_MLP = [("naive", 1, 1), ("gpipe", 1, 1), ("gpipe", 3, 1), ("1f1b", 1, 1), ("1f1b", 3, 1),
            ("1f1b", 4, 1), ("interleaved", 2, 2), ("interleaved", 4, 2), ("zbh1", 3, 1), ("zbv", 4, 2)]
MESH_GPT = [("gpipe", 4, 1), ("1f1b", 3, 1), ("interleaved", 2, 2), ("interleaved", 2, 3), ("zbh1", 3, 1),
            ("zbv", 3, 2)]


def _steps(X, y, config, idx, targets, on_mesh: bool):
    """The MLP and GPT steps of MESH_MLP and MESH_GPT, on the world or on this rank's pp group of a
    (dp=2, pp=2) mesh: two independent 2-stage pipelines, one per dp index."""
    import torch.distributed as dist

    from distlab.mesh import grid
    from distlab.pipeline.gpt import gpt_pipeline_step
    from distlab.pipeline.schedules import make_schedule

    group = grid(dp=2, pp=2)["pp"].get_group() if on_mesh else None
    p = dist.get_world_size(group)
    mlp = steps_on_rank(MESH_MLP, SIZES, X, y, group=group)
    gpt = [gpt_pipeline_step(config, idx, targets, make_schedule(n, p, m, v), group) for n, m, v in MESH_GPT]
    return mlp, gpt


def test_schedules_run_unchanged_on_the_pipeline_dim_of_a_mesh() -> None:
    """On 4 ranks as grid(dp=2, pp=2), each pp group runs its own 2-stage pipeline: each must equal
    single-process training and the 2-rank whole-world run, for the MLP and the tied-embedding GPT."""
    from distlab.pipeline.gpt import gpt_reference_step

    X, y = regression_data(24, 8, 4, seed=0)
    config, idx, targets = _gpt_problem()
    on_mesh = [r["mesh"] for r in _ranks(4)]
    on_world = [r["mesh"] for r in _ranks(2)]
    references = ([reference_step(SIZES, X, y)] * len(MESH_MLP),
                  [gpt_reference_step(config, idx, targets)] * len(MESH_GPT))
    for kind, configs in enumerate((MESH_MLP, MESH_GPT)):
        for k, c in enumerate(configs):
            world = merge([r[kind][k] for r in on_world])
            assert step_parity(world, references[kind][k]), ("world", c)
            for pipeline in layout(dp=2, pp=2)["pp"]:  # [0, 2] and [1, 3]: positions 0, 1 of each group
                outcome = merge([on_mesh[r][kind][k] for r in pipeline])
                assert step_parity(outcome, references[kind][k]), (pipeline, c)
                assert step_parity(outcome, world), (pipeline, c)


def _gpt_steps(config, idx, targets, configs):
    from distlab.pipeline.gpt import gpt_pipeline_step
    from distlab.pipeline.schedules import make_schedule

    p = launch.world_size()
    return [gpt_pipeline_step(config, idx, targets, make_schedule(n, p, m, v)) for n, m, v in configs]


def test_gpt_blocks_pipeline_matches_single_process_with_the_tied_embedding_summed() -> None:
    from distlab.pipeline.gpt import gpt_reference_step

    config, idx, targets = _gpt_problem()
    configs = GPT_CONFIGS
    results = [r["gpt"] for r in _ranks(3)]
    reference = gpt_reference_step(config, idx, targets)
    for k, c in enumerate(configs):
        assert step_parity(merge([r[k] for r in results]), reference), c
        assert "wte.weight" in results[0][k].grads and "wte.weight" in results[2][k].grads
        assert torch.equal(results[0][k].params["wte.weight"], results[2][k].params["wte.weight"])


def test_exercise_check_accepts_the_solution_on_real_ranks() -> None:
    from distlab.pipeline.exercises import RUN_MS, check_one_f_one_b
    from distlab.pipeline.schedules import one_f_one_b_order

    def solution(p, m):
        return [[(a.op, a.microbatch) for a in order] for order in one_f_one_b_order(p, m)]

    report = check_one_f_one_b(solution)
    assert report, str(report)
    assert len(report.cases) == 9 + len(RUN_MS)
    assert "4 real ranks, m=8" in str(report) and "agree with the reference within 1e-05: ok" in str(report)


def test_command_line_checks_the_step_and_explains_the_measured_bubble(capsys: pytest.CaptureFixture) -> None:
    from distlab.pipeline.__main__ import main

    assert main(["--world-size", "2", "-m", "2", "--batch", "8", "--sizes", "8,16,4", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "1f1b p=2 m=2 v=1: loss, all 4 gradients and all 4 updated weights agree with the reference" in out
    assert "measured bubble" in out and "formula (p-1)/(v m+p-1) = 33.3%" in out
    assert "the ranks share the CPU's cores and the operating system decides which one runs" in out
