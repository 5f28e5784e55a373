"""ZeRO stages 1-2 (`ShardedOptimizer`) when the ranks use different parameters: an error, on every rank.

Rank 0 computes a gradient for layer `b`, rank 1 does not (a branch taken on one rank only). In stage 2
the buckets are reduce-scattered from gradient hooks as they fill, so rank 0 would reduce `b`'s bucket
during the backward and rank 1 at the step: different collectives in different orders, a hang or a
silently wrong average. Every rank must instead raise an error that names the parameters, the ranks
that used them and the fix. A layer that no rank uses (`c`) is skipped, as `torch.optim` skips it.
All cases run in one start of 2 ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from distlab import launch


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.ModuleDict({"a": nn.Linear(4, 3), "b": nn.Linear(4, 3), "c": nn.Linear(4, 3)})


def _on_ranks() -> dict:
    import torch.distributed as dist

    from distlab.memory.zero import ShardedOptimizer

    r = dist.get_rank()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(r))
    out: dict = {}
    for stage in (1, 2):
        model = _model()
        opt = ShardedOptimizer(model.named_parameters(), torch.optim.SGD, stage=stage, lr=0.1,
                               bucket_numel=12)  # a bucket per weight or bias: several collectives
        loss = model["a"](x).sum() + (model["b"](x).sum() if r == 0 else 0)
        try:  # stage 2 raises at the end of the backward, stage 1 in step()
            loss.backward()
            opt.step()
            out[f"uneven{stage}"] = "no error"
        except RuntimeError as e:
            out[f"uneven{stage}"] = str(e)
        opt.remove()
        model = _model()  # `c` unused on every rank: no error, no update, as torch.optim
        opt = ShardedOptimizer(model.named_parameters(), torch.optim.SGD, stage=stage, lr=0.1,
                               bucket_numel=12)
        (model["a"](x).sum() + model["b"](x).sum()).backward()
        opt.step()
        before = _model()
        out[f"unused{stage}"] = [torch.equal(model[k].weight, before[k].weight) for k in "abc"]
        opt.remove()
    return out


def test_uneven_parameter_use_is_an_error_on_every_rank() -> None:
    results = launch.run(_on_ranks, 2, timeout=20)
    for r, res in enumerate(results):
        for stage in (1, 2):
            msg = res[f"uneven{stage}"]
            assert "b.weight" in msg and "b.bias" in msg and "a.weight" not in msg, (r, stage, msg)
            assert "rank 0" in msg and "multiply" in msg, (r, stage, msg)
            assert res[f"unused{stage}"] == [False, False, True], (r, stage)
