"""ZeRO stages 1 and 2 around any torch optimizer: `ShardedOptimizer(params, torch.optim.AdamW, ...)`.

This is what `torch.distributed.optim.ZeroRedundancyOptimizer` offers, built the way the ZeRO paper
describes (Rajbhandari et al. 2020, sec. 5.1-5.2). Group-rank i owns the i-th slice of every parameter
(`buckets.Bucket`); the given optimizer class runs on this rank's slices only, so its state (AdamW's two
moments, SGD's momentum) is 1/N of the whole. Per step:

- during the backward, `reduce.GradientReducer` reduce-scatters the gradients bucket by bucket (its
  hooks send each bucket as it fills, as DDP does with its all-reduce), so that each rank gets its slices
  of the averaged gradient. Stage 1 (P_os) leaves every `p.grad` as it is (this rank's own, whole
  gradient); stage 2 (P_os+g) keeps only the slice: `p.grad` is None, and the averaged slice is
  `grad_shard(p)`. Several backward passes before `step()` add up; a parameter used on some ranks only
  is an error on every rank;
- then the inner optimizer steps on the slices, and one all-gather per bucket brings every replica the
  new parameters.

Parameter groups (their own lr, weight_decay, ...) are kept: slice groups mirror them, and
`param_groups` is the user's, so learning-rate schedulers work. Optimizers that work element by element
(SGD, Adam, AdamW, RMSprop, Adagrad...) give the same result on slices (rows of dim 0, `buckets`) as on
whole tensors; one that reads a tensor's shape (Adafactor) does not, and is
refused.

The rest of a torch optimizer's interface, as `ZeroRedundancyOptimizer` offers it: `step(closure)` runs
the closure once, first, and returns its loss; `step(**kwargs)` reaches the inner optimizer; keys travel
between the user's groups and the inner ones both ways; `add_param_group` works after construction (a
collective, between steps). A sparse gradient is made dense (`validate.densify_grad`); a sparse parameter
is refused by name. Where stage 2 is involved, one ShardedOptimizer reduces a parameter's gradient, the
newest (`reduce.GradientReducer`): stepping an older one is an error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.dist_compat import all_gather_single
from distlab.memory.zero.buckets import Bucket, make_buckets
from distlab.memory.zero.clip import clip_sharded_grads_
from distlab.memory.zero.reduce import GradientReducer
from distlab.memory.zero.state_dict import full_state, load_full_state, sharded_state
from distlab.memory.zero.validate import check_dense, check_group


def fast_path(optimizer_class: type, defaults: dict, groups: list[dict]) -> tuple[dict, dict]:
    """`foreach=True` for the optimizer on the slices, where its class takes it and the user left it
    unset: one call per operation over all the slices, not a Python loop over them (torch picks it by
    itself on a GPU, not on a CPU). Returns that, and the value the user's groups show (the class's)."""
    foreach = inspect.signature(optimizer_class).parameters.get("foreach")
    if foreach is None or "foreach" in defaults or any("foreach" in g for g in groups):
        return {}, {}
    return {"foreach": True}, {"foreach": foreach.default}


SHAPE_AWARE = ("Adafactor", "Muon", "LBFGS", "SparseAdam")  # these read a parameter's shape or history


def _check_arguments(optimizer_class: Any, stage: Any) -> None:
    """ShardedOptimizer is stage 1 or 2, around an element-wise torch optimizer class."""
    if stage not in (1, 2) or isinstance(stage, bool):
        raise ValueError(f"stage={stage!r}: ShardedOptimizer is ZeRO stage 1 or 2; for stage 3 shard "
                         "the model with distlab.memory.zero.fsdp.fully_shard and give its parameters to "
                         "any optimizer")
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise ValueError(f"optimizer_class={optimizer_class!r} is not a torch optimizer class; pass "
                         "one, e.g. torch.optim.AdamW")
    if optimizer_class.__name__ == "Muon":
        raise ValueError("optimizer_class=Muon orthogonalises each whole weight matrix (Newton-Schulz), "
                         "which a flat slice is not, so ZeRO's slices cannot run it; use "
                         "distlab.memory.muon.OwnerMuon or AllToAllMuon (Muon for the matrices, AdamW for "
                         "the rest), explained in book chapter 7, section 'Distributed Muon' "
                         "(book/07-memory.md, label sec-distributed-muon)")
    if optimizer_class.__name__ in SHAPE_AWARE:
        raise ValueError(f"optimizer_class={optimizer_class.__name__} reads each parameter's shape, "
                         "which a flat slice does not have; use an element-wise optimizer (SGD, Adam, "
                         "AdamW...)")


class ShardedOptimizer(torch.optim.Optimizer):
    """`optimizer_class` (e.g. `torch.optim.AdamW`) with its state sharded over `group`: ZeRO `stage`
    1 or 2. `params` are parameters or parameter groups, as for any torch optimizer; `**defaults` are the
    optimizer's keyword arguments (lr, weight_decay, ...). Every rank of `group` builds it on the same
    model; the parameters of group-rank 0 are broadcast. `bucket_numel`: elements per collective
    (about 1M: a model of a few million parameters gets several buckets, so that the first ones are
    reduced while the backward goes on)."""

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer], *,
                 group: dist.ProcessGroup | None = None, stage: int = 1, bucket_numel: int = 1 << 20,
                 **defaults: Any) -> None:
        _check_arguments(optimizer_class, stage)
        check_group(group)
        super().__init__(params, defaults)
        self.group, self.stage = group, stage
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.bucket_numel = bucket_numel
        everything = [p for g in self.param_groups for p in g["params"]]
        self.names = self._parameter_names(everything)
        self.buckets, self.where, self.shards = [], {}, {}
        self._add_buckets(everything)
        self.optim = self._inner_optimizer(optimizer_class, defaults)
        self.reducer = GradientReducer(self.buckets, self.shards, self.names, group, stage)

    def _add_buckets(self, params: list[Tensor]) -> None:
        """Check `params`, make every replica's copy rank 0's, and cut them into buckets and slices."""
        check_dense(params, self.names, "ShardedOptimizer")
        for p in params:
            dist.broadcast(p.detach(), group=self.group, group_src=0)  # every replica starts alike
        new = make_buckets(list(reversed(params)), self.n, self.bucket_numel)  # backward order
        self.buckets.extend(new)
        where, shards = self._slices(new)
        self.where.update(where)
        self.shards.update(shards)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group, as on any torch optimizer; after construction a collective (every rank of
        the group adds the same group): its parameters get buckets and slices of their own, the inner
        optimizer a mirroring group, and the gradient hooks are set again (call it between steps)."""
        super().add_param_group(param_group)
        if not hasattr(self, "optim"):  # torch.optim.Optimizer.__init__ adding the constructor's groups
            return
        g = self.param_groups[-1]
        self.names.update(self._parameter_names(g["params"], start=len(self.names), groups=[g]))
        self._add_buckets(list(g["params"]))
        self.optim.add_param_group({**{k: v for k, v in g.items() if k != "params"},
                                    "params": [self.shards[id(p)] for p in g["params"]]})
        for k, v in self.optim.param_groups[-1].items():
            if k != "params":
                g.setdefault(k, v)
        self.reducer.remove()
        self.reducer = GradientReducer(self.buckets, self.shards, self.names, self.group, self.stage)

    def _parameter_names(self, everything: list[Tensor], start: int = 0,
                         groups: list[dict] | None = None) -> dict[int, str]:
        """id(param) -> its name, for error messages: named_parameters() gives names; a plain list,
        positions."""
        names = {id(p): name for g in (groups or self.param_groups) for p, name in
                 zip(g["params"], g.get("param_names", [None] * len(g["params"])), strict=True)}
        for k, p in enumerate(everything, start):
            names[id(p)] = names.get(id(p)) or f"parameter {k} of shape {tuple(p.shape)}"
        return names

    def _slices(self, buckets: list[Bucket]) -> tuple[dict[int, tuple[Bucket, int]], dict[int, nn.Parameter]]:
        """Where each parameter of `buckets` sits (its bucket and position) and this rank's slice of it."""
        where: dict[int, tuple[Bucket, int]] = {}
        # id(param) -> this rank's slice of it, a view of the parameter itself: what the optimizer sees.
        # Being a view, it follows the parameter when a checkpoint is loaded into the model.
        shards: dict[int, nn.Parameter] = {}
        for b in buckets:
            for k, p in enumerate(b.params):
                where[id(p)] = (b, k)
                shards[id(p)] = nn.Parameter(b.own(p.detach(), k, self.rank), requires_grad=p.requires_grad)
        return where, shards

    def _inner_optimizer(self, optimizer_class: type[torch.optim.Optimizer],
                         defaults: dict[str, Any]) -> torch.optim.Optimizer:
        """The given optimizer on the slices, in groups that mirror the user's (with `fast_path`'s foreach,
        kept in self._fast); the user's groups then show its own defaults (betas, eps...)."""
        inner = [{**{k: v for k, v in g.items() if k != "params"},
                  "params": [self.shards[id(p)] for p in g["params"]]} for g in self.param_groups]
        self._fast, unset = fast_path(optimizer_class, defaults, self.param_groups)
        optim = optimizer_class(inner, **defaults, **self._fast)
        for g, ig in zip(self.param_groups, optim.param_groups, strict=True):
            for k, v in ig.items():  # the optimizer's own defaults (betas, eps...), visible to the user
                if k != "params":
                    g.setdefault(k, unset.get(k, v))
        return optim

    # -- gradients: reduce-scattered during the backward, by `reduce.GradientReducer`
    def reduce_gradients(self) -> None:
        """Average the gradients over the group into this rank's slices (`grad_shard`); `step()` calls it.
        The backward has reduced them already; this reduces what no backward did (gradients set by
        hand), and waits. Call it yourself to read or clip the averaged gradient before the step."""
        self.reducer.reduce_gradients()

    def grad_shard(self, p: Tensor) -> Tensor | None:
        """This rank's slice of the averaged gradient of parameter `p` (after `reduce_gradients`)."""
        return self.shards[id(p)].grad

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Clip the averaged gradient by its global norm, as `torch.nn.utils.clip_grad_norm_` does on one
        process (reduces the gradients first); returns the norm before clipping. A collective."""
        self.reduce_gradients()
        grads = [s.grad for s in self.shards.values() if s.grad is not None]
        return clip_sharded_grads_(grads, max_norm, norm_type, self.group)

    # -- the step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """Average the gradients, run the optimizer on this rank's slices, all-gather the parameters.
        `closure` (forward and backward, returning the loss) runs first, once, as the element-wise torch
        optimizers run it; its loss is returned. `kwargs` go to the inner optimizer's step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        self._groups_to_inner()
        self.optim.step(**kwargs)
        for g, ig in zip(self.param_groups, self.optim.param_groups, strict=True):
            for k, v in ig.items():  # and keys the inner optimizer set in its step reach the user's groups
                if k != "params" and k not in self._fast:
                    g[k] = v
        self._gather_parameters()
        return loss

    def _groups_to_inner(self) -> None:
        """The user's groups' settings (lr from a scheduler, a key the user added) into the inner ones."""
        if len(self.param_groups) != len(self.optim.param_groups):
            raise RuntimeError(f"ShardedOptimizer: param_groups has {len(self.param_groups)} groups but the "
                               f"sharded optimizer knows {len(self.optim.param_groups)}; add a group with "
                               "opt.add_param_group(group), not by appending to param_groups")
        for g, ig in zip(self.param_groups, self.optim.param_groups, strict=True):
            for k, v in g.items():
                if k != "params":
                    ig[k] = v
            ig.update(self._fast)

    def _gather_parameters(self) -> None:
        """Every replica gets the updated parameters: one all-gather per bucket of the ranks' slices."""
        gathers = []  # every bucket's all-gather in flight at once; unpack each as it lands
        for b in self.buckets:
            mine = torch.empty(b.width, dtype=b.dtype, device=b.params[0].device)  # padding: never read
            for k, p in enumerate(b.params):
                shard = self.shards[id(p)]
                b.local(mine, k)[:shard.numel()].copy_(shard.reshape(-1))
            full = torch.empty(b.n, b.width, dtype=b.dtype, device=mine.device)
            gathers.append((b, full, all_gather_single(full.view(-1), mine, group=self.group, async_op=True)))
        for b, full, work in gathers:
            work.wait()
            for k, p in enumerate(b.params):  # this rank's own rows are the slices, updated in place
                b.copy_out(full, k, p.detach(), skip=self.rank)
        self.reducer.forget()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: every `p.grad` and every slice's."""
        super().zero_grad(set_to_none=True)
        for s in self.shards.values():
            s.grad = None
        self.reducer.forget()

    # -- state dicts
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The whole optimizer state in `torch.optim`'s format, on every rank (a collective): what the same
        optimizer would hold on one process. It loads into a `ShardedOptimizer` on any number of ranks."""
        return full_state(self)

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's slices of the state, with what `state_dict.merge_sharded` needs to put the ranks'
        pieces together again (no communication: each rank saves its own file)."""
        return sharded_state(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load a whole state (from `state_dict`, or from `torch.optim` on one process): each rank keeps
        its own slices of it."""
        load_full_state(self, state_dict)

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        self.reducer.remove()
