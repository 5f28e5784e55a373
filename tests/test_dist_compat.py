"""distlab.dist_compat: torch 2.13's names for the flat-tensor collectives, and the older names on a torch
that lacks them (the H100 node behind assets/gpu had 2.11). No ranks: torch.distributed's functions are
replaced by recorders, so the test shows which one each call reaches and with which arguments."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab import dist_compat


def _recorder(calls: list, name: str):
    def fn(output, input, **kwargs):
        calls.append((name, output, input, kwargs))
        return "work"
    return fn


@pytest.mark.parametrize("new, old, ours", [
    ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter_single"),
    ("all_gather_single", "all_gather_into_tensor", "all_gather_single"),
])
def test_the_new_name_when_torch_has_it_the_old_one_otherwise(monkeypatch, new, old, ours) -> None:
    out, inp, calls = torch.empty(2), torch.ones(4), []
    monkeypatch.setattr(dist, new, _recorder(calls, new), raising=False)
    monkeypatch.setattr(dist, old, _recorder(calls, old))
    assert getattr(dist_compat, ours)(out, inp, group=None, async_op=True) == "work"
    monkeypatch.delattr(dist, new)  # an older torch: only the old name exists
    assert getattr(dist_compat, ours)(out, inp, group=None, async_op=False) == "work"
    assert [c[0] for c in calls] == [new, old]
    for _, o, i, kwargs in calls:
        assert o is out and i is inp and kwargs["group"] is None
    assert [c[3]["async_op"] for c in calls] == [True, False]
    if ours == "reduce_scatter_single":
        assert all(c[3]["op"] == dist.ReduceOp.SUM for c in calls)
