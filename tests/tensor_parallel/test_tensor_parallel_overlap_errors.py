"""Collective matmul's bad arguments (chapter 5): shards of different lengths on different ranks, and
`dim` set to the contraction dimension, each a ValueError on every rank, never a native abort of the
backend or a wrong result; after each the ranks are still in step (a correct call follows)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab import launch
from distlab.tensor_parallel.collective_matmul import all_gather_matmul, matmul_reduce_scatter


def _bad_calls() -> dict:
    r, p = dist.get_rank(), dist.get_world_size()
    rhs = torch.ones(4, 2, dtype=torch.float64)
    out = {}
    calls = {
        "uneven": lambda: all_gather_matmul(torch.ones(1, 3 - r, 4, dtype=torch.float64), rhs, where="c_fc"),
        "uneven_batch": lambda: matmul_reduce_scatter(torch.ones(1 + r, 4, 4, dtype=torch.float64), rhs,
                                                      where="c_proj"),
        "contraction": lambda: all_gather_matmul(torch.ones(1, 3, 4, dtype=torch.float64), rhs, dim=2),
        "contraction_neg": lambda: all_gather_matmul(torch.ones(1, 3, 4, dtype=torch.float64), rhs, dim=-1),
        "rs_contraction": lambda: matmul_reduce_scatter(torch.ones(1, 4, 4, dtype=torch.float64), rhs, dim=2),
        "out_of_range": lambda: all_gather_matmul(torch.ones(1, 3, 4, dtype=torch.float64), rhs, dim=3),
    }
    for name, call in calls.items():
        try:
            call()
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    x = torch.arange(12, dtype=torch.float64).view(1, 3, 4) + 100 * r
    y, gathered = all_gather_matmul(x, rhs)  # still in step: the right answer
    full = torch.cat([torch.arange(12, dtype=torch.float64).view(1, 3, 4) + 100 * k for k in range(p)], 1)
    out["after"] = torch.equal(y, full @ rhs) and torch.equal(gathered, full)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return launch.run(_bad_calls, 2)


def test_uneven_shards_are_a_value_error_on_every_rank(results):
    for out in results:
        assert "c_fc: the ranks' shards differ in shape" in out["uneven"], out["uneven"]
        assert "from (1, 2, 4) to (1, 3, 4)" in out["uneven"] and "equal slice" in out["uneven"]
        assert "c_proj: the ranks' inputs differ in shape" in out["uneven_batch"], out["uneven_batch"]
        assert out["after"]
    assert results[0]["uneven"] == results[1]["uneven"]


def test_the_contraction_dimension_is_refused_not_gathered(results):
    for out in results:
        for case in ("contraction", "contraction_neg", "rs_contraction"):
            assert "is x's last dimension, the one the matmul contracts" in out[case], out[case]
        assert "dim=3 is out of range for x of shape (1, 3, 4)" in out["out_of_range"], out["out_of_range"]


def test_the_contraction_dimension_is_refused_on_one_process():
    with pytest.raises(ValueError, match="dim=2 is x's last dimension"):
        all_gather_matmul(torch.ones(1, 3, 4), torch.ones(4, 2), dim=2)
