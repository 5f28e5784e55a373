"""ZeRO when the ranks use different parameters: an error on every rank, in every stage.

Rank 0 computes a gradient for layer `b`, rank 1 does not (a branch taken on one rank only). In stage 2
the buckets are reduce-scattered from gradient hooks as they fill, so rank 0 would reduce `b`'s bucket
during the backward and rank 1 at the step: different collectives in different orders, a hang or a
silently wrong average (`ShardedOptimizer` stage 2 before this test: `a.bias` off by 0.3 after one SGD
step, no error). Every rank must instead raise an error that names the parameters, the ranks that used
them and the fix: `ShardedOptimizer` stages 1-2, `fully_shard` (stage 3) and the chapter's `ZeRO` engine
(stages 0-3). A layer that no rank uses (`c`) is skipped, as `torch.optim` skips it. One start of 2 ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from distlab import launch


class Branches(nn.ModuleDict):
    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        return self["a"](x).sum() + (self["b"](x).sum() if use_b else 0)


def _model() -> Branches:
    torch.manual_seed(0)
    return Branches({"a": nn.Linear(4, 3), "b": nn.Linear(4, 3), "c": nn.Linear(4, 3)})


def _cases():
    """(name, build(model) -> (step, weights)) for every ZeRO flavour."""
    from distlab.memory.zero import ShardedOptimizer, ZeRO
    from distlab.memory.zero.fsdp import full_parameters, fully_shard

    def sharded(stage: int):
        def build(model):
            opt = ShardedOptimizer(model.named_parameters(), torch.optim.SGD, stage=stage, lr=0.1,
                                   bucket_numel=12)  # a bucket per weight or bias: several collectives
            return opt.step, lambda: {k: v.detach() for k, v in model.named_parameters()}, opt.remove
        return build

    def fsdp(model):
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return opt.step, lambda: full_parameters(model), lambda: None

    def engine(stage: int):
        def build(model):
            z = ZeRO(model, stage, lr=0.1)
            return z.step, z.full_parameters, z.remove
        return build

    return [("zero1", sharded(1)), ("zero2", sharded(2)), ("fsdp", fsdp),
            *[(f"engine{s}", engine(s)) for s in range(4)]]


def _on_ranks() -> dict:
    import torch.distributed as dist

    r = dist.get_rank()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(r))
    out: dict = {}
    for name, build in _cases():
        model = _model()
        step, _, remove = build(model)
        try:  # stage 2-3 raise at the end of the backward, the others in step()
            model(x, use_b=r == 0).backward()
            step()
            out[name] = "no error"
        except RuntimeError as e:
            out[name] = str(e)
        remove()
        model = _model()  # `c` unused on every rank: no error, no update, as torch.optim
        step, weights, remove = build(model)
        model(x, use_b=True).backward()
        step()
        before, after = _model(), weights()
        out[name + " unused"] = [torch.equal(after[f"{k}.weight"], before[k].weight) for k in "abc"]
        remove()
    return out


def test_uneven_parameter_use_is_an_error_on_every_rank() -> None:
    results = launch.run(_on_ranks, 2, timeout=20)
    for r, res in enumerate(results):
        for name in ("zero1", "zero2", "fsdp", "engine0", "engine1", "engine2", "engine3"):
            msg = res[name]
            assert "b.weight" in msg and "b.bias" in msg and "a.weight" not in msg, (r, name, msg)
            assert "rank 0 only" in msg and "multiply" in msg, (r, name, msg)
            assert res[name + " unused"] == [False, False, True], (r, name)
