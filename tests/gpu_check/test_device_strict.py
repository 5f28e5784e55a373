"""The strict device rule, on gloo and the CPU (issue 34): every tensor handed to a collective is on the
rank's device, and a tensor made without `device=` is caught as it would be on a GPU node.

- `RuleLog(device=..., strict=True)`: a test declares the rank's device ("cuda:0" on a gloo CPU rank, as
  on an NCCL rank) and a CPU tensor handed to a collective is an error naming the call; not strict, the
  errors are kept in `device_errors`;
- `strict_devices()`: the default device becomes `meta`, so a rank function that makes a tensor without
  `device=` fails at its first collective, on CPU, as it would under NCCL on a GPU node;
- chapter 1's checks under it (issue 34's cause 1: the ring check made its inputs on the CPU, and at
  world size 1 on a GPU node NCCL refused them).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab import launch
from distlab.gpu_check.rules import DeviceError, on_device, rule_log
from distlab.gpu_check.strict import strict_devices


def _declared_cuda_rank() -> dict:
    """A gloo CPU rank declared as an NCCL rank (cuda:<rank>): what the rule says of its calls."""
    r = launch.rank()
    lenient = rule_log(device=f"cuda:{r}")
    with lenient:
        x = torch.ones(3)
        dist.all_reduce(x)  # runs (gloo takes it), but is recorded as an error
    try:
        with rule_log(device=f"cuda:{r}", strict=True):
            dist.broadcast(torch.zeros(2), src=0)
        strict = ""
    except DeviceError as e:
        strict = str(e)
    with rule_log(device="cpu", strict=True) as fine:
        dist.all_reduce(torch.ones(1))
    return {"lenient": lenient.device_errors, "strict": strict, "fine": len(fine.calls), "sum": x[0].item()}


def test_a_cpu_tensor_on_a_rank_declared_cuda_is_an_error_naming_the_call():
    for r, out in enumerate(launch.run(_declared_cuda_rank, 2, backend="gloo")):
        (lenient,) = out["lenient"]
        assert lenient.startswith(f"all_reduce (c10d.allreduce_): a tensor on cpu, but this rank's device "
                                  f"is cuda:{r}: make it with device=launch.device()"), lenient
        assert out["strict"].startswith("broadcast (c10d.broadcast_): a tensor on cpu"), out["strict"]
        assert out["fine"] == 1 and out["sum"] == 2.0


def test_a_device_without_an_index_takes_any_index():
    t = torch.empty(1, device="meta")
    assert on_device(t, torch.device("meta")) and not on_device(t, torch.device("cpu"))
    assert on_device(torch.empty(1), torch.device("cpu"))


def _made_without_device(named: bool) -> float:
    with strict_devices():
        x = torch.full((4,), 1.0, device=launch.device()) if named else torch.full((4,), 1.0)
        dist.all_reduce(x)
        return x.sum().item()


def test_strict_devices_catches_a_tensor_made_without_device():
    assert launch.run(_made_without_device, 2, True) == [8.0, 8.0]
    with pytest.raises(launch.RankError, match=r"all_reduce \(c10d.allreduce_\): a tensor on meta \(the "
                                               r"strict check's stand-in for the default device"):
        launch.run(_made_without_device, 2, False)


def _chapter_1_under_strict(ranks_per_node: int | None) -> list:
    from distlab.collectives import hierarchical_all_reduce, ring_all_reduce
    from distlab.collectives.all_reduce_diagnosis import _run_cases

    def two_level(t, node, across):
        return hierarchical_all_reduce(t, ranks_per_node)

    with strict_devices():
        fn = ring_all_reduce if ranks_per_node is None else two_level
        return _run_cases(fn, [1, 5, 8], ranks_per_node)


@pytest.mark.parametrize("p,ranks_per_node", [(1, None), (3, None), (4, 2)])
def test_chapter_1_checks_make_their_tensors_on_the_ranks_device(p, ranks_per_node):
    """Issue 34, cause 1: the check's inputs were made on the CPU whatever the backend; now they are
    made on `launch.device()`, which this run plays (a tensor without device= would be on meta)."""
    per_rank = launch.run(_chapter_1_under_strict, p, ranks_per_node)
    assert per_rank == [[[], [], []]] * p


def _strictly(fn, *args, **kwargs):
    """A rank function run under the strict device rule."""
    with strict_devices():
        return fn(*args, **kwargs)


@pytest.fixture
def strict_launches(monkeypatch):
    """Every `launch.run` a check makes runs its rank function under `strict_devices`."""
    real = launch.run
    monkeypatch.setattr(launch, "run", lambda fn, p, *a, **k: real(_strictly, p, fn, *a, **k))


def _average_bucket(bucket) -> None:
    """Lab 2's bucketed all-reduce, made on the gradients' own device."""
    flat = torch.cat([q.grad.reshape(-1) for q in bucket])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for q in bucket:
        q.grad.copy_(flat[offset:offset + q.numel()].view_as(q.grad))
        offset += q.numel()


def test_every_chapter_check_passes_a_right_solution_under_the_strict_rule(strict_launches):
    """Chapters 2, 5, 6 and 7's multi-rank checks make their tensors and layers on `launch.device()` and
    their references on the CPU, so a right solution passes when tensors made without device= would
    fail (they did before: each check's inputs were made on the default device)."""
    from distlab.data_parallel.exercises import check_bucketed_all_reduce
    from distlab.memory.zero.exercises import check_zero2_hook, zero2_reduce_scatter
    from distlab.moe.exercises import check_expert_parallel
    from distlab.tensor_parallel.exercises import check_tensor_parallel
    from tests.tensor_parallel.test_tensor_parallel import RightF, RightG, make_row_linear, right_shard

    results = [check_bucketed_all_reduce(_average_bucket, world_sizes=(2,)),
               check_tensor_parallel(RightF.apply, RightG.apply, right_shard, make_row_linear(RightG.apply),
                                     world_sizes=(2,)),
               check_expert_parallel(lambda layer, x: layer(x).y, world_sizes=(2,)),
               check_zero2_hook(zero2_reduce_scatter)]
    for result in results:
        assert result, str(result)


class _LooksCuda(torch.Tensor):
    """A CPU tensor that says it is on a GPU: enough for the gloo point-to-point guard, which only asks."""

    is_cuda = True


def _gloo_p2p_guard() -> str:
    from types import SimpleNamespace

    from distlab.gpu_check.rules import _check_gloo_p2p

    boxed = dist.group.WORLD.boxed()
    t = torch.Tensor._make_subclass(_LooksCuda, torch.ones(2))
    allreduce, send = (SimpleNamespace(namespace="c10d", _opname=name) for name in ("allreduce_", "send"))
    _check_gloo_p2p(allreduce, ([t], boxed))  # a collective: gloo stages it
    _check_gloo_p2p(send, ([torch.ones(2)], boxed, 0, 0))  # host memory: fine
    try:
        _check_gloo_p2p(send, ([t], boxed, 0, 0))
    except DeviceError as e:
        return str(e)
    return ""


def test_a_cuda_tensor_sent_point_to_point_over_gloo_is_stopped_with_the_reason():
    (message,) = launch.run(_gloo_p2p_guard, 1, backend="gloo")
    assert message.startswith("send of a CUDA tensor over gloo: gloo sends and receives host memory only")
