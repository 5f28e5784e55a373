"""Chapter 12: dry runs. One rank of a published layout of thousands of ranks, on a fake world and the
meta device: its recorded bytes equal chapter 9's traffic model and its memory chapter 7's estimator.

Pure Python in this process (no rank starts): a fake process group is a world of n ranks in one process.
Each published layout runs at reduced depth (one block per pipeline stage) and with two micro-batches,
so it takes seconds; the layout itself (dp, pp, tp, ZeRO, group sizes) is the published one.
"""

from __future__ import annotations

import argparse

import pytest
import torch.distributed as dist

from distlab.dryrun import agreement, dry_run, fake_world, from_published, predicted
from distlab.dryrun.__main__ import main, parser
from distlab.dryrun.layouts import dry_run_names, estimator_config
from distlab.memory.estimate.estimator import estimate

# (published run, rank): Llama 3's 16K-GPU layout (ZeRO-1), Megatron-LM's 146B (ZeRO-0, all-reduce) and
# BLOOM (tp = 4, micro-batch 2, ZeRO-1); a first-stage rank each, so that memory is compared too.
# (published run, rank, compare memory): Llama 3's 16K-GPU layout (ZeRO-1) at rank 5 (first stage),
# Megatron-LM's 146B (ZeRO-0, all-reduce) at its last rank (last stage: gradients sent back, the loss),
# BLOOM (tp = 4, micro-batch 2, ZeRO-1) at rank 3. Chapter 7's estimator is compared on first-stage ranks.
LAYOUTS = [("llama3-405b-16k", 5, True), ("megatron-146b", 1535, False), ("bloom-176b", 3, True)]


def _reduced(name: str):
    return from_published(name, layers=from_published(name).plan.pp, microbatches=2)


def test_three_published_layouts_send_and_hold_what_the_closed_forms_say() -> None:
    for name, rank, memory in LAYOUTS:
        layout = _reduced(name)
        run = dry_run(layout, rank)
        a = agreement(run.traffic, run.memory.to_dict(), predicted(layout, rank), compare_memory=memory)
        assert a.within(0.01), (name, a)
        assert set(a.memory) == ({"params", "grads", "optimizer", "activations"} if memory else set())
        assert {axis for axis, _ in a.traffic} == {"dp", "pp", "tp"}, name
        # the group sizes the calls were made on are the published layout's
        sizes = {c.axis: c.group_size for c in run.calls}
        p = layout.plan
        assert sizes == {"dp": p.dp, "pp": p.pp, "tp": p.tp}, (name, sizes)
        assert run.control_calls == 1  # ZeRO's flags, counted apart from the model's traffic
        assert dist.is_initialized() is False  # the fake world is gone after the run
        last = run.coords["pp"] == p.pp - 1
        assert (("pp", "send_bwd") in run.traffic) == last and (("pp", "send_fwd") in run.traffic) != last
    assert _reduced("megatron-146b").coords(1535) == {"pp": 7, "dp": 23, "tp": 7}


def test_layouts_come_from_the_published_table() -> None:
    layout = from_published("llama3-405b-16k")
    assert layout.world_size == 16384 and layout.plan.zero_stage == 1
    assert layout.batch == 2048 and layout.seq == 8192 and layout.config.n_layer == 126
    assert "course's GPT block" in layout.note
    assert from_published("gpt3-175b").config.vocab_size % 8 == 0  # padded to a multiple of tp
    assert "llama3-405b-128k" not in dry_run_names()
    est = estimate(estimator_config(layout))
    assert est.n_params == pytest.approx(estimator_config(layout).layers * 12 * 16384 ** 2, rel=0.05)


def test_bad_input_names_the_parameter_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"published='llama3-405b-128k' uses context parallelism \(cp=16\)"):
        from_published("llama3-405b-128k")
    with pytest.raises(ValueError, match=r"layers=3 must be a whole number from pp=16"):
        from_published("llama3-405b-16k", layers=3)
    with pytest.raises(ValueError, match=r"microbatches=99 must be a whole number from 1 to the run's m=16"):
        from_published("llama3-405b-16k", microbatches=99)
    with pytest.raises(ValueError, match=r"rank=16384 is not a rank of llama3-405b-16k's 16384 ranks"):
        from_published("llama3-405b-16k").coords(16384)
    with pytest.raises(ValueError, match=r"rank=4 is not a rank of a world of 4"):
        with fake_world(4, 4):
            pass
    with fake_world(0, 2):
        with pytest.raises(ValueError, match="a process group is already initialized"):
            with fake_world(0, 2):
                pass


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    p = parser()
    assert issubclass(p.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
    for bad, message in ((["--rank", "-1"], "-1 must be at least 0"),
                         (["--published", "nope"], "invalid choice: 'nope'"),
                         (["--published", "bloom-176b", "--rank", "384"], "rank=384 is not a rank")):
        with pytest.raises(SystemExit) as done:
            main(bad)
        assert done.value.code == 2 and message in capsys.readouterr().err
    assert main(["--published", "bloom-176b", "--rank", "3", "--layers", "12", "--microbatches", "1"]) == 0
    out = capsys.readouterr().out
    assert "rank 3 of bloom-176b at (pp, dp, tp) = (0, 0, 3)" in out and "(tolerance 1%): ok" in out
    assert out.rstrip().endswith("(attention: flash), 19% of one A100's 80 GB of HBM: fits")
    # the math path's probabilities do not fit an H100: the verdict says so, and the exit code is 1
    assert main(["--published", "llama3-405b-16k", "--microbatches", "2",
                 "--attention", "math"]) == 1
    out = capsys.readouterr().out
    assert "(tolerance 1%): ok" in out and "(attention: math)" in out
    assert out.rstrip().endswith("DOES NOT FIT")


def test_the_comm_log_records_fake_collectives_on_fake_tensors_too() -> None:
    """The house's log sees a fake world's calls on meta tensors (what dry_run uses) and under
    FakeTensorMode (torch.compile's fake tensors), with the mesh axis, the group size and B."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from distlab.comm_log import comm_log
    from distlab.mesh import grid

    with fake_world(5, 16384):
        mesh = grid(pp=16, dp=128, tp=8)
        with comm_log(mesh=mesh) as log:
            dist.all_reduce(torch.empty(1024, device="meta"), group=mesh["tp"].get_group())
            with FakeTensorMode(allow_non_fake_inputs=True):
                x = torch.empty(256, dtype=torch.bfloat16)
                out = torch.empty(256 * 128, dtype=torch.bfloat16)
                dist.all_gather_single(out, x, group=mesh["dp"].get_group())
    assert [(r.op, r.axis, r.group_size, r.nbytes) for r in log.records] == [
        ("all_reduce", "tp", 8, 4096), ("all_gather", "dp", 128, 256 * 128 * 2)]
