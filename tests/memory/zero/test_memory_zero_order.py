"""ZeRO stage 3 when a rank skips a whole block in the forward: a clear error on every rank, not a hang.

Rank 1 skips the second block (a layer dropped on one rank only), or the last one (an early exit: it has no
forward left to disagree on, so the ranks meet where the backward begins). Under stage 3 every rank
all-gathers a unit before it runs, so the ranks' all-gathers would pair up wrongly: before this test,
`fully_shard` and the engine's stage 3 hung until the launcher reported a deadlock. Now the ranks agree on
the unit before each gather (`memory.zero.order`), and every rank raises a RuntimeError within seconds that
names the module each rank was about to run, the ranks, and the fix. At 2 and 3 ranks; the same models with
every block on every rank train without an error (their parity with FSDP2 and one process is tested in
test_memory_zero.py and test_memory_zero_optimizer.py).
"""

from __future__ import annotations

import functools
import time

import pytest
import torch
from torch import nn

from distlab import launch


class Blocks(nn.Module):
    """An embedding-free stack: `h` is a ModuleList (so `default_units` takes each block as a unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.h = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(3))
        self.out = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor, skip: int | None = None) -> torch.Tensor:
        x = self.inp(x)
        for i, block in enumerate(self.h):
            if i != skip:
                x = block(x)
        return self.out(x).pow(2).mean()


def _on_ranks() -> dict:
    import torch.distributed as dist

    from distlab.memory.zero import ZeRO
    from distlab.memory.zero.fsdp import fully_shard

    r = dist.get_rank()
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(r))
    out: dict = {}
    for name in ("fully_shard", "engine"):
        for skip in (None, 1, 2):
            torch.manual_seed(0)
            model = Blocks()
            if name == "fully_shard":
                for block in [*model.h, model]:
                    fully_shard(block)
                step = torch.optim.SGD(model.parameters(), lr=0.1).step
            else:
                step = ZeRO(model, 3, lr=0.1).step
            start = time.perf_counter()
            try:
                model(x, skip=skip if r == 1 else None).backward()
                step()
                out[name, skip] = ("no error", 0.0)
            except RuntimeError as e:
                out[name, skip] = (str(e), time.perf_counter() - start)
            dist.barrier()
    return out


@functools.cache
def _results(n: int) -> list[dict]:
    return launch.run(_on_ranks, n, timeout=60)


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_that_skips_a_block_is_an_error_on_every_rank(n: int) -> None:
    others = "rank 0" if n == 2 else "ranks 0, 2"
    for r, res in enumerate(_results(n)):
        for name, who in (("fully_shard", "fully_shard (ZeRO stage 3)"), ("engine", "ZeRO stage 3")):
            assert res[name, None] == ("no error", 0.0), (r, name)
            msg, seconds = res[name, 1]
            assert msg.startswith(f"{who}: the ranks of the group of {n} disagree on the module they run "
                                  "next: "), (r, name, msg)
            assert f"{others} the forward of h.1; rank 1 the forward of h.2" in msg, (r, name, msg)
            assert "every rank must run the same modules in the same order" in msg, msg
            assert "Run every module on every rank" in msg, msg
            assert seconds < 10, (r, name, seconds)
            msg, seconds = res[name, 2]  # rank 1 stops before the last block
            assert f"{others} the forward of h.2; rank 1 the backward of the root" in msg, (r, name, msg)
            assert seconds < 10, (r, name, seconds)
