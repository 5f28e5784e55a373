"""The one data-parallel step on a rank (`reference.Task.shard_loss`, `shard_backward`) and the one loss
average (`reference.group_mean`), against one process on the whole batch: world sizes 1-4, uneven shards
(10 rows over 3 and 4 ranks), ignored targets (a language model's -100)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab import launch, parity, reference
from distlab.sharding import shard, uneven_shard

TOL = parity.TOLERANCE[torch.float32]


def _tasks() -> dict[str, reference.Task]:
    gpt = reference.gpt_task(n_layer=1, n_embd=16, block_size=8, n=40, n_head=2, sentences=100)
    gpt.targets[::3, 2:5] = reference.IGNORE_INDEX  # some targets left out of the mean
    gpt.targets[1, :] = reference.IGNORE_INDEX  # and one example with none that counts
    return {"mlp": reference.mlp_task(sizes=(6, 8, 3), n=40), "gpt": gpt}


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _one_process(task: reference.Task, x: torch.Tensor, y: torch.Tensor) -> dict:
    model = task.build(0)
    loss = task.loss(model, x, y)
    loss.backward()
    return {"loss": loss.item(), "gradients": _grads(model)}


def _simulated_ranks(task: reference.Task, x: torch.Tensor, y: torch.Tensor, world: int) -> dict:
    """Every rank's share in one process, averaged as an all-reduce averages them."""
    losses, grads = [], []
    for r in range(world):
        model = task.build(0)
        losses.append(task.shard_backward(model, x, y, r, world).item())
        grads.append(_grads(model))
    return {"loss": sum(losses) / world,
            "gradients": {n: torch.stack([g[n] for g in grads]).mean(0) for n in grads[0]}}


@pytest.mark.parametrize("rows,world", [(10, 1), (10, 2), (10, 3), (10, 4), (12, 3), (12, 4), (7, 4)])
def test_uneven_shard_covers_the_batch_in_order(rows: int, world: int) -> None:
    parts = [uneven_shard(rows, r, world) for r in range(world)]
    sizes = [s.stop - s.start for s in parts]
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert [s.start for s in parts] == [0, *[s.stop for s in parts[:-1]]]  # contiguous, in rank order
    assert sizes == [len(t) for t in torch.arange(rows).tensor_split(world)]
    if rows % world == 0:
        assert parts == [shard(rows, r, world) for r in range(world)]


def test_uneven_shard_errors() -> None:
    with pytest.raises(ValueError, match="global batch 3 is smaller than world size 4.*at least 4"):
        uneven_shard(3, 0, 4)
    with pytest.raises(ValueError, match=r"rank 3 is outside 0..2 for world size 3"):
        uneven_shard(10, 3, 3)


@pytest.mark.parametrize("name", ["mlp", "gpt"])
@pytest.mark.parametrize("rows,world", [(12, 1), (12, 2), (12, 3), (12, 4), (10, 3), (10, 4)])
def test_shares_average_to_the_whole_batch(name: str, rows: int, world: int) -> None:
    task = _tasks()[name]
    x, y = task.inputs[:rows], task.targets[:rows]
    report = parity.compare(_simulated_ranks(task, x, y, world), _one_process(task, x, y),
                            dtype=torch.float32, label=f"{name}, {rows} rows over {world}")
    assert report.passed, report.verdict()


def test_the_plain_mean_of_uneven_shards_is_not_the_batch_mean() -> None:
    """What the weighting is for: 10 rows over 4 ranks (3, 3, 2, 2), the unweighted mean of the shard means
    is off by far more than rounding, the weighted one is not."""
    task = _tasks()["mlp"]
    x, y = task.inputs[:10], task.targets[:10]
    model = task.build(0)
    whole = task.loss(model, x, y).item()
    with torch.no_grad():
        plain = sum(task.loss(model, x[s], y[s]).item() for s in
                    (uneven_shard(10, r, 4) for r in range(4))) / 4
        weighted = sum(task.shard_loss(model, x, y, r, 4).item() for r in range(4)) / 4
    assert abs(plain - whole) > 100 * TOL and abs(weighted - whole) <= TOL


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_equal_shares_are_the_rows_mean_loss_exactly(name: str) -> None:
    task = reference.mlp_task(sizes=(6, 8, 3), n=40) if name == "mlp" else reference.gpt_task(
        n_layer=1, n_embd=16, block_size=8, n=40, n_head=2, sentences=100)
    model = task.build(0)
    x, y = task.batch(0, 12, 0)
    for r in range(3):
        mine = shard(12, r, 3)
        assert torch.equal(task.shard_loss(model, x, y, r, 3), task.loss(model, x[mine], y[mine]))


def test_a_shard_with_no_counted_target_is_refused() -> None:
    task = _tasks()["gpt"]
    x, y = task.inputs[:4], task.targets[:4].clone()
    y[2:] = reference.IGNORE_INDEX
    with pytest.raises(ValueError, match="rank 1's rows 2..3 of the batch of 4 have no target that counts"):
        task.shard_loss(task.build(0), x, y, 1, 2)


def _on_ranks(name: str, rows: int) -> dict:
    task = _tasks()[name]
    x, y = task.inputs[:rows], task.targets[:rows]
    model = task.build(0)
    loss = task.shard_backward(model, x, y, dist.get_rank(), dist.get_world_size())
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    return {"loss": reference.group_mean(loss), "gradients": _grads(model)}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_on_ranks_the_step_and_group_mean_match_one_process(world: int) -> None:
    """Real ranks (gloo): 10 rows (uneven over 3 and 4) of the GPT task with ignored targets; the loss
    averaged by `group_mean` and the all-reduced gradients equal one process's on the whole batch."""
    task = _tasks()["gpt"]
    ref = _one_process(task, task.inputs[:10], task.targets[:10])
    for r, out in enumerate(launch.run(_on_ranks, world, "gpt", 10, timeout=120.0)):
        report = parity.compare(out, ref, dtype=torch.float32, label=f"rank {r} of {world}")
        assert report.passed, report.verdict()
