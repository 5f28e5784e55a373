"""ZeRO around torch's optimizers: `ShardedOptimizer` (stages 1-2) and `fully_shard` (stage 3).

One start of N ranks per world size (1-4) runs every check of that size:

- stages 1 and 2 with AdamW and two parameter groups (decay on matrices, none and another lr on the rest)
  against `ZeroRedundancyOptimizer(AdamW)` + DDP on the same ranks and AdamW on one process: within
  `zero_parity.TOLERANCE` (the averaged gradient is the same sum in another order);
- `fully_shard` + AdamW against FSDP2's `fully_shard` + AdamW: fp32 bit for bit (both cut dim 0 and
  reduce-scatter the same buffers, so the ring adds in the same order); bf16 under
  `MixedPrecisionPolicy(param_dtype=bfloat16)` at 2 and 4 ranks within bf16's resolution (atol 1e-2: a
  few ulps of parameters of size ~0.5 after 3 steps at lr 1e-2; bit for bit on the machines we tried);
  the optimizer's whole state in torch's format, against AdamW on one process;
- on 2 ranks also: the outside-style test (SGD with momentum, Adam, AdamW), clipping by the global norm
  against `torch.nn.utils.clip_grad_norm_`, an unused parameter, two backward passes before a step,
  the state dicts, whole and sharded, and stage 1 reducing from the hooks during the backward (a
  `p.grad` changed afterwards is refused);
  on 3 ranks: resuming from the 2-rank state (2 -> 3 ranks) equals one process that never stopped.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from torch import nn

from distlab import launch, sharding
from distlab.memory.zero import ShardedOptimizer, merge_sharded
from distlab.memory.zero import parity as zero_parity
from distlab.memory.zero.fsdp import clip_grad_norm_, full_parameters, fully_shard, optimizer_state_dict

TOL = zero_parity.TOLERANCE
STEPS = 3


def _groups(model: nn.Module) -> list[dict]:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0, "lr": 5e-3}]


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _train(model: nn.Module, opt, task, steps: int = STEPS, start: int = 0, forward=None, clip=None) -> list:
    """Train on this rank's slice of each global batch (the whole batch outside the ranks)."""
    n, r = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    norms = []
    for s in range(start, start + steps):
        x, y = task.batch(s, zero_parity.GLOBAL_BATCH, zero_parity.SEED)
        mine = sharding.shard(len(x), r, n)
        opt.zero_grad()
        task.loss(forward or model, x[mine], y[mine]).backward()
        if clip is not None:
            norms.append(float(clip()))
        opt.step()
    return norms


def _sharded(stage: int, task) -> tuple[dict, dict, dict]:
    model = task.build(zero_parity.SEED)
    opt = ShardedOptimizer(_groups(model), torch.optim.AdamW, stage=stage, lr=1e-2)
    _train(model, opt, task)
    return _params(model), opt.state_dict(), opt.sharded_state_dict()


def _torch_zero(task) -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = task.build(zero_parity.SEED)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = ZeroRedundancyOptimizer(_groups(model)[0]["params"], torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    opt.add_param_group(_groups(model)[1])
    _train(model, opt, task, forward=ddp)
    return _params(model)


def _fsdp(kind: str, task, mp=None) -> dict:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    model = task.build(zero_parity.SEED)
    mp = mp or MixedPrecisionPolicy()
    for m in [*model.h, model]:
        if kind == "ours":
            fully_shard(m, mp_policy=mp)
        else:
            torch_fully_shard(m, mesh=DeviceMesh.from_group(dist.group.WORLD, "cpu"), mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    _train(model, opt, task)
    if kind == "ours":
        return {**full_parameters(model), "optimizer": optimizer_state_dict(model, opt)}
    return {k: v.full_tensor().detach().clone() for k, v in model.named_parameters()}


def _users_test(cls, kwargs: dict, how: str) -> dict:
    """What a torch user writes: build the model and the sharded optimizer, train, return the model."""
    task = zero_parity.zero_task("mlp")
    model = task.build(zero_parity.SEED)
    if how == "stage3":
        fully_shard(model[0])
        fully_shard(model)
        opt = cls(model.parameters(), **kwargs)
    else:
        opt = ShardedOptimizer(model.parameters(), cls, stage=int(how[-1]), **kwargs)
    _train(model, opt, task)
    return full_parameters(model) if how == "stage3" else _params(model)


def _clipped(how: str) -> tuple[list, dict]:
    task = zero_parity.zero_task("gpt")
    model = task.build(zero_parity.SEED)
    if how == "stage3":
        for m in [*model.h, model]:
            fully_shard(m)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        norms = _train(model, opt, task, clip=lambda: clip_grad_norm_(model, 0.5))
        return norms, full_parameters(model)
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, stage=int(how[-1]), lr=1e-2)
    norms = _train(model, opt, task, clip=lambda: opt.clip_grad_norm_(0.5))
    return norms, _params(model)


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(5, 3), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        return self.a(x).pow(2).mean() + (self.b(x).pow(2).mean() if use_b else 0)


def _unused(how: str) -> dict:
    """Step 0 uses a and b; steps 1-2 only a: torch.optim leaves b where step 0 put it."""
    model = TwoLayers()
    if how == "stage3":
        fully_shard(model.b)
        fully_shard(model)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
    else:
        opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=int(how[-1]), lr=0.1)
    for s in range(3):
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(s))
        opt.zero_grad()
        model(x, use_b=s == 0).backward()
        opt.step()
    return full_parameters(model) if how == "stage3" else _params(model)


def _accumulated(how: str) -> dict:
    """Two backward passes (two micro-batches) before each step: the gradients add up, as autograd's do."""
    task = zero_parity.zero_task("mlp")
    model = task.build(zero_parity.SEED)
    if how == "stage3":
        fully_shard(model[0])
        fully_shard(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    else:
        opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=int(how[-1]), lr=1e-2)
    _accumulate(model, opt, task)
    return full_parameters(model) if how == "stage3" else _params(model)


def _accumulate(model: nn.Module, opt, task) -> None:
    n, r = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    for s in range(STEPS):
        x, y = task.batch(s, zero_parity.GLOBAL_BATCH, zero_parity.SEED)
        mine = sharding.shard(len(x), r, n)
        x, y = x[mine], y[mine]
        opt.zero_grad()
        half = len(x) // 2
        for part in (slice(0, half), slice(half, len(x))):
            task.loss(model, x[part], y[part]).backward()
        opt.step()


def _during_backward() -> dict:
    """Stage 1: the averaged slices are there when backward() returns (reduced from the hooks, as DDP
    does), `p.grad` is still this rank's own; changing `p.grad` afterwards is refused, not lost."""
    task = zero_parity.zero_task("mlp")
    model = task.build(zero_parity.SEED)
    opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, stage=1, lr=0.1, bucket_numel=64)
    x, y = task.batch(0, zero_parity.GLOBAL_BATCH, zero_parity.SEED)
    mine = sharding.shard(len(x), dist.get_rank(), dist.get_world_size())
    task.loss(model, x[mine], y[mine]).backward()
    out = {"ready": all(opt.grad_shard(p) is not None for p in model.parameters()),
           "own": [p.grad.clone() for p in model.parameters()],
           "buckets": len(opt.buckets)}
    next(model.parameters()).grad.mul_(0.5)
    try:
        opt.step()
        out["changed"] = "no error"
    except RuntimeError as e:
        out["changed"] = str(e)
    return out


def _on_ranks(resume: dict | None = None) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    n = dist.get_world_size()
    gpt = zero_parity.zero_task("gpt")
    out: dict = {"stage1": _sharded(1, gpt), "stage2": _sharded(2, gpt), "zero_redundancy": _torch_zero(gpt),
                 "ours": _fsdp("ours", gpt), "fsdp2": _fsdp("torch", gpt)}
    if n in (2, 4):  # bf16: exact at 2 ranks, within tolerance at 4
        bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        out["ours_bf16"], out["fsdp2_bf16"] = _fsdp("ours", gpt, bf16), _fsdp("torch", gpt, bf16)
    if n == 2:
        for name, cls, kw in OPTIMIZERS:
            for how in ("stage1", "stage2", "stage3"):
                out["user", name, how] = _users_test(cls, kw, how)
        for how in ("stage1", "stage2", "stage3"):
            out["clip", how] = _clipped(how)
            out["unused", how] = _unused(how)
            out["accumulated", how] = _accumulated(how)
        out["during_backward"] = _during_backward()
    if resume is not None:  # go on from another dp size's state: the model's weights and the optimizer's
        model = gpt.build(zero_parity.SEED)
        model.load_state_dict(resume["params"], strict=False)  # lm_head.weight is tied to wte
        opt = ShardedOptimizer(_groups(model), torch.optim.AdamW, stage=2, lr=1e-2)
        opt.load_state_dict(resume["state"])
        _train(model, opt, gpt, steps=2, start=STEPS)
        out["resumed"] = _params(model)
    return out


OPTIMIZERS = [("SGD", torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
              ("Adam", torch.optim.Adam, {"lr": 1e-2}),
              ("AdamW", torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.05})]


@functools.cache
def _ranks(n: int) -> list[dict]:
    resume = None
    if n == 3:  # 2 -> 3 ranks: the whole state saved on 2 ranks, loaded on 3
        params, state, _ = _ranks(2)[0]["stage2"]
        resume = {"params": params, "state": state}
    return launch.run(_on_ranks, n, resume, timeout=240.0)


@functools.cache
def _reference(steps: int = STEPS) -> tuple[dict, dict, nn.Module, torch.optim.Optimizer]:
    task = zero_parity.zero_task("gpt")
    model = task.build(zero_parity.SEED)
    opt = torch.optim.AdamW(_groups(model), lr=1e-2)
    _train(model, opt, task, steps=steps)
    return _params(model), opt.state_dict(), model, opt


def _close(a: dict, b: dict, **tol) -> None:
    for k in (k for k in b if k != "optimizer"):
        torch.testing.assert_close(a[k].float(), b[k].float(), **tol, msg=k)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_stages_1_2_equal_zero_redundancy_ddp_and_one_process(n: int) -> None:
    ref, ref_state, _, _ = _reference()
    for r in _ranks(n):
        for stage in ("stage1", "stage2"):
            params, state, _ = r[stage]
            _close(params, ref, **TOL)
            _close(params, r["zero_redundancy"], **TOL)
            assert state["param_groups"] == ref_state["param_groups"]  # torch's format, groups and all
            for i, entry in ref_state["state"].items():
                for key in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(state["state"][i][key], entry[key], **TOL)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_stage3_equals_fsdp2_fp32_and_bf16(n: int) -> None:
    r = _ranks(n)[0]
    _close(r["ours"], r["fsdp2"], atol=0.0, rtol=0.0)
    if "ours_bf16" in r:
        _close(r["ours_bf16"], r["fsdp2_bf16"], atol=1e-2, rtol=0.0)
    params, state = _reference_adamw_single_group()
    _close(r["ours"], params, **TOL)
    assert r["ours"]["optimizer"]["param_groups"] == state["param_groups"]
    for i, entry in state["state"].items():  # the whole state, in torch's format, from the slices
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(r["ours"]["optimizer"]["state"][i][key], entry[key], **TOL)


@functools.cache
def _reference_adamw_single_group() -> tuple[dict, dict]:
    task = zero_parity.zero_task("gpt")
    model = task.build(zero_parity.SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    _train(model, opt, task)
    return _params(model), opt.state_dict()


@pytest.mark.parametrize("name,cls,kwargs", OPTIMIZERS)
def test_a_torch_user_gets_torchs_optimizer(name: str, cls, kwargs: dict) -> None:
    task = zero_parity.zero_task("mlp")
    model = task.build(zero_parity.SEED)
    _train(model, cls(model.parameters(), **kwargs), task)
    for r in _ranks(2):
        for how in ("stage1", "stage2", "stage3"):
            _close(r["user", name, how], _params(model), **TOL)


def test_clipping_by_the_global_norm_equals_torch() -> None:
    task = zero_parity.zero_task("gpt")
    model = task.build(zero_parity.SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    norms = _train(model, opt, task, clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))
    assert max(norms) > 0.5  # the clip bites
    for r in _ranks(2):
        for how in ("stage1", "stage2", "stage3"):
            got_norms, params = r["clip", how]
            torch.testing.assert_close(torch.tensor(got_norms), torch.tensor(norms), **TOL)
            _close(params, _params(model), **TOL)


def test_an_unused_parameter_is_skipped_as_torch_skips_it() -> None:
    model = TwoLayers()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for s in range(3):
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(s))
        opt.zero_grad()
        model(x, use_b=s == 0).backward()
        opt.step()
    for r in _ranks(2):
        for how in ("stage1", "stage2", "stage3"):
            _close(r["unused", how], _params(model), **TOL)


def test_gradient_accumulation_adds_up_in_every_stage() -> None:
    task = zero_parity.zero_task("mlp")
    model = task.build(zero_parity.SEED)
    _accumulate(model, torch.optim.Adam(model.parameters(), lr=1e-2), task)  # one process, 2 x 12 rows
    for r in _ranks(2):
        for how in ("stage1", "stage2", "stage3"):
            _close(r["accumulated", how], _params(model), **TOL)


def test_state_dicts_whole_sharded_and_on_another_dp_size() -> None:
    _, ref_state, _, _ = _reference()
    pieces = [r["stage2"][2] for r in _ranks(2)]
    merged = merge_sharded(list(reversed(pieces)))
    whole = _ranks(2)[0]["stage2"][1]
    assert merged["param_groups"] == whole["param_groups"] == ref_state["param_groups"]
    for i in whole["state"]:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(merged["state"][i][key], whole["state"][i][key])
    # 2 -> 3 ranks: five steps with a stop after three equal five without one, on one process
    task = zero_parity.zero_task("gpt")
    model = task.build(zero_parity.SEED)
    opt = torch.optim.AdamW(_groups(model), lr=1e-2)
    _train(model, opt, task, steps=STEPS + 2)
    for r in _ranks(3):
        _close(r["resumed"], _params(model), **TOL)
    with pytest.raises(ValueError, match=r"pieces hold ranks \[1\] of a group of 2; pass the sharded"):
        merge_sharded(pieces[1:])


def test_stage1_reduces_during_the_backward_and_refuses_a_gradient_changed_afterwards() -> None:
    task = zero_parity.zero_task("mlp")
    model = task.build(zero_parity.SEED)
    x, y = task.batch(0, zero_parity.GLOBAL_BATCH, zero_parity.SEED)
    for r, res in enumerate(_ranks(2)):
        got = res["during_backward"]
        assert got["buckets"] > 1 and got["ready"], r  # several buckets, all reduced by backward()'s end
        model.zero_grad()
        mine = sharding.shard(len(x), r, 2)
        task.loss(model, x[mine], y[mine]).backward()  # p.grad is this rank's own gradient, as computed
        for own, p in zip(got["own"], model.parameters(), strict=True):
            torch.testing.assert_close(own, p.grad, **TOL)
        assert "changed after the backward reduce-scattered it" in got["changed"], got["changed"]
        assert "opt.clip_grad_norm_" in got["changed"]
