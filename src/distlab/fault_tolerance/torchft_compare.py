"""Section 4: the same methods with torchft (Meta's fault-tolerance library for PyTorch, 0.2.0).

- `torchft_pseudo_gradients`: inside a rank, train with torchft's own `LocalSGD` or `DiLoCo` (unchanged)
  and with ours on the same seed, data and inner AdamW, and return both runs' pseudo-gradients and
  parameters after every outer step. torchft's classes talk to their `Manager` only through
  `allreduce`, `start_quorum`, `should_commit`, `current_step` and the state-dict hooks; `GroupManager`
  gives them exactly that over a torch process group (what torchft's own unit tests do with a mock), so
  the comparison is of the algorithms, not of the quorum. The quorum is `quorum_kill.py`'s subject.

torchft is an optional extra (`pip install -e '.[torchft]'`); this module imports it only when called,
and `torchft_missing` says what a lab cell would have shown when it is not installed.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.fault_tolerance.replica_loop import Recipe, inner_optimizer, make_trainer, train_shards
from distlab.fault_tolerance.streaming import layer_fragments
from distlab.reference import Task

TORCHFT_INSTALL = ".venv/bin/pip install -e '.[torchft]'"  # pyproject.toml's extra: torchft==0.2.0, Linux


def torchft_missing(would_show: str) -> str | None:
    """None when torchft can be imported; otherwise the lines a lab cell prints instead of running its
    torchft part: what it would have shown (`would_show`) and how to install torchft (an optional extra,
    whose wheels are for Linux only), so that the cell, and the lab, go on."""
    try:
        found = importlib.util.find_spec("torchft") is not None
    except (ImportError, ValueError):  # a broken or stubbed-out installation
        found = False
    if found:
        return None
    return (f"torchft is not installed, so this cell skips its part. With it, the cell would {would_show}.\n"
            f"To see it: {TORCHFT_INSTALL} (in the clone; torchft's wheels are for Linux), then rerun.")


class _Done:
    """A finished piece of work, as torchft's `Work` looks to its callers (`wait`, `get_future`)."""

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor

    def wait(self, timeout: object = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result([self.tensor])
        return future


class GroupManager:
    """The part of `torchft.manager.Manager` that `LocalSGD` and `DiLoCo` call, over a fixed group: every
    quorum is the whole group, every commit succeeds, `allreduce` averages (torchft's ReduceOp.AVG)."""

    _use_async_quorum = False

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group, self.step, self.allreduce_bytes = group, 0, 0

    def allreduce(self, tensor: Tensor, should_quantize: bool = False, **_: Any) -> _Done:
        if should_quantize:
            raise ValueError("should_quantize=True needs torchft's Triton kernels (a GPU); pass False")
        dist.all_reduce(tensor, group=self.group)
        tensor.div_(dist.get_world_size(self.group))
        self.allreduce_bytes += tensor.numel() * tensor.element_size()
        return _Done(tensor)

    def start_quorum(self, *args: Any, **kwargs: Any) -> None:
        return None

    def should_commit(self, *args: Any, **kwargs: Any) -> bool:
        self.step += 1
        return True

    def current_step(self) -> int:
        return self.step

    def register_state_dict_fn(self, *args: Any) -> None:
        return None

    def allow_state_dict_read(self) -> None:
        return None

    def disallow_state_dict_read(self) -> None:
        return None


@dataclass
class OuterSteps:
    """One implementation's run: after every outer step, the averaged pseudo-gradients it applied (by
    parameter name) and the parameters it left; and its loss at every inner step."""

    pseudo_gradients: list[dict[str, Tensor]] = field(default_factory=list)
    params: list[dict[str, Tensor]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def flat(self) -> dict[str, object]:
        """One family per outer step, for `distlab.parity.compare`: "outer step i" (the parameters after
        it), "pseudo-gradient i", and "losses"."""
        return {"losses": self.losses, **{f"outer step {i}": p for i, p in enumerate(self.params)},
                **{f"pseudo-gradient {i}": g for i, g in enumerate(self.pseudo_gradients)}}


def _fragment_modules(model: nn.Module, fragments: list[list[str]]) -> list[nn.Module]:
    """Each fragment as a module holding the model's own parameters (what torchft's DiLoCo takes)."""
    params = dict(model.named_parameters())
    modules = []
    for names in fragments:
        module = nn.Module()
        for name in names:
            module.register_parameter(name.replace(".", "__"), params[name])
        modules.append(module)
    return modules


def _snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def torchft_run(recipe: Recipe, task: Task, steps: int, global_batch: int, seed: int = 0,
                group: dist.ProcessGroup | None = None, dtype: torch.dtype = torch.float64) -> OuterSteps:
    """Inside a rank: torchft's `LocalSGD` ("local_sgd") or `DiLoCo` ("diloco", "streaming": K
    fragments, one torch.optim.SGD(nesterov=True) outer optimizer per fragment)."""
    from torchft.local_sgd import DiLoCo as TorchftDiLoCo
    from torchft.local_sgd import LocalSGD as TorchftLocalSGD
    model = task.build(seed).to(dtype)
    names = {id(p): n for n, p in model.named_parameters()}
    inner = inner_optimizer(recipe, list(model.parameters()))
    manager, out = GroupManager(group), OuterSteps()
    if recipe.method == "local_sgd":
        wrapper = TorchftLocalSGD(manager, model, inner, recipe.sync_every)
    else:
        k = recipe.fragments if recipe.method == "streaming" else 1
        modules = _fragment_modules(model, layer_fragments(model, k))
        outers = [torch.optim.SGD(m.parameters(), lr=recipe.outer_lr, momentum=recipe.outer_momentum,
                                  nesterov=recipe.outer_momentum > 0) for m in modules]
        for outer in outers:  # the averaged pseudo-gradients sit in .grad when the outer step starts
            outer.register_step_pre_hook(lambda opt, *_: out.pseudo_gradients.append(
                {names[id(q)]: q.grad.clone() for g in opt.param_groups for q in g["params"]}))
            outer.register_step_post_hook(lambda *_: out.params.append(_snapshot(model)))
        wrapper = TorchftDiLoCo(manager, modules, inner, outers, recipe.sync_every)
    with wrapper:  # hooks run in the order registered: ours after torchft's
        if recipe.method == "local_sgd":
            inner.register_step_post_hook(lambda *_: _after_local_sgd(manager, model, out))
        out.losses = train_shards(task, steps, global_batch, seed, group, model, inner, inner.step)
    return out


def _after_local_sgd(manager: GroupManager, model: nn.Module, out: OuterSteps) -> None:
    """Registered after torchft's own hook: a new commit means the parameters were just averaged."""
    if manager.step > len(out.params):
        out.params.append(_snapshot(model))


def our_run(recipe: Recipe, task: Task, steps: int, global_batch: int, seed: int = 0,
            group: dist.ProcessGroup | None = None, dtype: torch.dtype = torch.float64) -> OuterSteps:
    """Inside a rank: the same training with this chapter's `LocalSGD`, `DiLoCo` or `StreamingDiLoCo`."""
    model = task.build(seed).to(dtype)
    inner = inner_optimizer(recipe, list(model.parameters()))
    trainer = make_trainer(recipe, model, inner, group)
    out = OuterSteps()
    syncs = trainer.fragments if recipe.method == "streaming" else [getattr(trainer, "outer", None)]
    names = {id(p): n for n, p in model.named_parameters()}

    def step() -> None:
        synced = trainer.step()
        if synced is False or synced is None:
            return
        out.params.append(_snapshot(model))
        if recipe.method != "local_sgd":
            sync = syncs[synced if recipe.method == "streaming" else 0]
            out.pseudo_gradients.append({names[id(p)]: d.clone()
                                         for p, d in zip(sync.params, sync.pseudo_gradients, strict=True)})

    out.losses = train_shards(task, steps, global_batch, seed, group, model, inner, step)
    return out
