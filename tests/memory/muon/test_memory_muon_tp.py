"""Muon's update of a column-parallel weight on 2, 3 and 4 tp ranks: gathered on the tp axis it equals one
process's Newton-Schulz of the whole matrix bit for bit, with the all-gather's bytes as predicted; the
block-wise approximation (each rank's rows alone) equals one process's `blockwise`, and its distance from
the exact update is measured and printed (an approximation: held to be far from exact, not near it)."""

from __future__ import annotations

import pytest
import torch

from distlab import launch
from distlab.comm_log import comm_log
from distlab.memory.muon.newton_schulz import zeropower_via_newtonschulz
from distlab.memory.muon.tensor_parallel import blockwise, blockwise_error, orthogonalise_column_parallel

ROWS, COLS = 48, 20  # rows divisible by 2, 3 and 4


def _update() -> torch.Tensor:
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(3))


def _on_ranks(t: int) -> dict:
    from distlab.mesh import grid

    mesh = grid(tp=t)
    group = mesh["tp"].get_group()
    r = mesh["tp"].get_local_rank()
    block = _update().chunk(t, dim=0)[r]
    with comm_log(mesh=mesh) as log:
        exact = orthogonalise_column_parallel(block, group, exact=True)
    approx = orthogonalise_column_parallel(block, group, exact=False)
    return {"exact": exact, "approx": approx, "bytes": log.bytes(axis="tp", op="all_gather"),
            "calls": len(log.records)}


@pytest.mark.parametrize("t", [2, 3, 4])
def test_gathered_update_is_exact_and_blockwise_is_measured(t):
    results = launch.run(_on_ranks, t, t)
    whole = zeropower_via_newtonschulz(_update())
    rows = ROWS // t
    for r, res in enumerate(results):
        assert torch.equal(res["exact"], whole[r * rows:(r + 1) * rows])
        assert res["bytes"] == ROWS * COLS * 4 and res["calls"] == 1  # one all-gather of the fp32 matrix
    assert torch.equal(torch.cat([res["approx"] for res in results]), blockwise(_update(), t))
    error, cosine = blockwise_error(_update(), t)
    print(f"t={t}: block-wise update is {error:.0%} of the exact one away, cosine {cosine:.2f}")
    assert error > 0.1 and cosine < 0.99  # the approximation is not the exact update


def test_bad_blocks_are_refused():
    with pytest.raises(ValueError, match="not divisible by t=5"):
        blockwise(_update(), 5)
    with pytest.raises(ValueError, match="block has shape \\(4,\\)"):
        orthogonalise_column_parallel(torch.zeros(4), None)
