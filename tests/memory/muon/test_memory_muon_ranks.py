"""Both distributed Muon layouts on 1-4 ranks: the same parameters as torch.optim.Muon + AdamW on one
process after 10 steps (float64, `distlab.parity`'s 1e-10), and the comm_log's bytes and the optimizer
state on every rank equal to `cost_model`'s, exactly. The MLP has five matrices of five shapes (uneven on
2, 3 and 4 ranks, and on 4 ranks the owners are uneven too); the GPT has 4 matrices on 3 ranks and
embeddings (the tied head) for AdamW. One start of the ranks per world size."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from distlab import launch, parity
from distlab.memory.muon import cost_model as cm
from distlab.memory.muon.parity import LAYOUTS, muon_task, report, train_muon, train_reference
from distlab.memory.muon.split import split_parameters

F64 = 8  # bytes per element


def _on_ranks(tasks: tuple[str, ...]) -> dict:
    return {(task, layout): train_muon(layout, task) for task in tasks for layout in LAYOUTS}


def _check_bytes(task: str, layout: str, world: int, runs: list) -> None:
    model = cm.from_parameters(*split_parameters(muon_task(task).build(0)))
    for rank, run in enumerate(runs):
        by_op: dict[str, int] = {}
        for r in run.records:
            by_op[r.op] = by_op.get(r.op, 0) + r.nbytes
        want = (cm.owner_bytes(model, world, F64) if layout == "owner"
                else cm.all_to_all_bytes(model, world, rank, F64))
        assert by_op == want, (task, layout, world, rank)
        assert sum(r.sent_bytes for r in run.records) == cm.sent_bytes(layout, model, world, rank, F64)
        assert run.state_bytes == cm.state_bytes(layout, model, world, rank, F64), (layout, world, rank)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_both_layouts_equal_torch_muon_and_the_byte_formulas(world):
    tasks = ("mlp", "gpt") if world == 3 else ("mlp",)
    results = launch.run(_on_ranks, world, tasks)
    for task in tasks:
        ref = train_reference(task)
        for layout in LAYOUTS:
            runs = [res[task, layout] for res in results]
            for rank, run in enumerate(runs):
                report(run, ref, f"{task} {layout} rank {rank}").assert_passed()
            _check_bytes(task, layout, world, runs)


def _halves() -> dict:
    r = dist.get_rank()
    halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = halves[r // 2]
    out = {layout: train_muon(layout, "mlp", steps=4, group=group) for layout in LAYOUTS}
    return {k: v.params for k, v in out.items()}


def test_each_half_of_four_ranks_equals_one_process():
    ref = train_reference("mlp", steps=4)
    for rank, params in enumerate(launch.run(_halves, 4)):
        for layout, p in params.items():
            parity.compare(p, ref.params, name="parameters", label=f"{layout} rank {rank}").assert_passed()


def _missing_gradient() -> list[str]:
    from distlab.memory.muon import AllToAllMuon, OwnerMuon

    model = muon_task("mlp").build(0)
    errors = []
    for cls in (OwnerMuon, AllToAllMuon):
        opt = cls(*split_parameters(model), group=None)
        try:
            opt.step()
        except RuntimeError as e:
            errors.append(str(e))
    return errors


def test_a_step_without_gradients_names_the_parameter():
    for errors in launch.run(_missing_gradient, 2):
        assert len(errors) == 2
        assert all("parameter '0.weight' has no gradient" in e for e in errors)
