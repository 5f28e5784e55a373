"""One pipeline stage on its rank: the module, and what it keeps between a microbatch's passes.

A `Stage` holds four stashes keyed by microbatch:
- `inputs`: the tensor its forward started from (received, or handed over by the previous stage on the
  same rank), with `requires_grad` so that its gradient can be sent back;
- `outputs`: what the forward produced (for the last stage: the loss of that microbatch divided by m, so
  that the gradients add up to those of the mean loss over the whole batch);
- `grad_outputs`: the gradient of its output, received from the next stage;
- `grad_inputs`: the gradient of its input, computed by its backward, waiting to be sent back.
A backward frees its microbatch's stash, which is what makes 1F1B's memory bounded (Narayanan et al.
2021, sec. 2.2.1). The stage also counts the bytes of the tensors autograd saved for each stashed
microbatch (each tensor once, its own bytes, not those of a larger tensor it is a view of; weights not).

With `split_backward=True` (zero-bubble schedules, Qi et al. 2023) the backward runs in two passes, both
with autograd on the graph the forward built:
- `backward` (the schedule's B) asks `torch.autograd.grad` for the gradient of the stage's input *and*
  of the output of every layer that owns parameters (recorded by forward hooks), keeping the graph
  (`retain_graph=True`). Autograd computes only what leads to those tensors, so no weight gradient yet;
- `backward_weight` (W) then asks, layer by layer, for the gradient of that layer's own parameters from
  its output and the output gradient B kept: `torch.autograd.grad(y, params, dy)` walks only that
  layer's nodes (its input edge leads to no requested tensor), and frees them. The sum is the same
  weight gradient as the whole backward, computed by the same kernels from the same tensors.
Between B and W a microbatch still holds its stash (W reads the layers' saved inputs) plus one output
gradient per layer: the memory that deferring W costs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def _storage(t: Tensor) -> int:
    """The identity of `t`'s storage: its address, except on the meta device (a dry run), where every
    storage has address 0 and the C++ storage object tells them apart."""
    return t.untyped_storage()._cdata if t.is_meta else t.untyped_storage().data_ptr()


class Stage:
    """Model chunk `index` of `num_stages`, run on `m` microbatches; the last one applies `loss_fn`."""

    def __init__(self, index: int, module: nn.Module, num_stages: int, m: int,
                 loss_fn: Callable[[Tensor, Tensor], Tensor], split_backward: bool = False) -> None:
        self.index, self.module, self.num_stages, self.m, self.loss_fn = index, module, num_stages, m, loss_fn
        self.split_backward = split_backward
        self.layer_outputs: dict[int, list[tuple[Tensor, list[nn.Parameter]]]] = {}  # set by F, read by B
        self.weight_work: dict[int, list[tuple[Tensor, list[nn.Parameter], Tensor]]] = {}  # left for W
        self.inputs: dict[int, Tensor] = {}
        self.outputs: dict[int, Tensor] = {}
        self.grad_outputs: dict[int, Tensor] = {}
        self.grad_inputs: dict[int, Tensor] = {}
        self.saved_bytes: dict[int, int] = {}
        self.losses: dict[int, float] = {}
        self._weights = {_storage(q) for q in module.parameters()}

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1

    def forward(self, mb: int, x: Tensor, target: Tensor | None = None) -> None:
        """Run microbatch `mb` forward from input `x` (the last stage also needs its `target`), and
        stash what the backward will need."""
        if not self.is_first:
            x = x.requires_grad_()
            self.inputs[mb] = x
        seen: set[tuple[int, int, int]] = set()

        def pack(t: Tensor) -> Tensor:  # count each stored activation once; weights are not stash
            key = (_storage(t), t.storage_offset(), t.nbytes)  # (data_ptr, nbytes), also on the meta device
            if key[0] not in self._weights and key not in seen:
                seen.add(key)
                self.saved_bytes[mb] = self.saved_bytes.get(mb, 0) + t.nbytes
            return t

        records: list[tuple[Tensor, list[nn.Parameter]]] = []
        hooks = [layer.register_forward_hook(self._recorder(records)) for layer in self._weighted_layers()]
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = self.module(x)
                if self.is_last:
                    out = self.loss_fn(out, target) / self.m
                    self.losses[mb] = float("nan") if out.is_meta else out.item() * self.m  # meta: a dry run
        finally:
            for hook in hooks:
                hook.remove()
        self.outputs[mb] = out
        self.layer_outputs[mb] = records
        self._check_unshared(records)

    def _check_unshared(self, records: list[tuple[Tensor, list[nn.Parameter]]]) -> None:
        """Refuse a weight used by two layers of this stage (a tied weight, or a layer run twice): W asks
        autograd for d(layer output)/d(weight), which would then also count the path through the other
        use, whose own W counts it again: a wrong gradient without an error."""
        seen: set[int] = set()
        for _, params in records:
            for q in params:
                if id(q) in seen:
                    raise ValueError(
                        f"stage {self.index}: a parameter of shape {tuple(q.shape)} is used by two layers of "
                        "this stage (a tied weight, or a layer run twice), which a split backward cannot "
                        "handle layer by layer; put the two uses on different stages (for the GPT: "
                        "p * v >= 2), or use a schedule without W (1f1b)")
                seen.add(id(q))

    def _weighted_layers(self) -> list[nn.Module]:
        """The submodules that own parameters themselves (Linear, LayerNorm, Embedding), when split."""
        if not self.split_backward:
            return []
        return [layer for layer in self.module.modules()
                if any(q.requires_grad for q in layer.parameters(recurse=False))]

    @staticmethod
    def _recorder(records: list) -> Callable:
        def record(layer: nn.Module, _inputs: tuple, output: Tensor) -> None:
            records.append((output, [q for q in layer.parameters(recurse=False) if q.requires_grad]))
        return record

    def backward(self, mb: int) -> None:
        """Run microbatch `mb` backward: gradients accumulate in the parameters' `.grad`, the input's
        gradient waits in `grad_inputs` to be sent, and the microbatch's stash is freed. With
        `split_backward`, only the input gradient (B); `backward_weight` does the rest (W)."""
        if self.split_backward:
            self._backward_input(mb)
            return
        self.layer_outputs.pop(mb, None)
        out = self.outputs.pop(mb)
        if self.is_last:
            out.backward()
        else:
            torch.autograd.backward(out, grad_tensors=self.grad_outputs.pop(mb))
        if not self.is_first:
            self.grad_inputs[mb] = self.inputs.pop(mb).grad
        self.saved_bytes.pop(mb, None)

    def _backward_input(self, mb: int) -> None:
        """B: the gradient of the input and of each weighted layer's output, keeping the graph for W."""
        out = self.outputs.pop(mb)
        records = self.layer_outputs.pop(mb)
        wanted = ([] if self.is_first else [self.inputs[mb]]) + [y for y, _ in records]
        grad_out = None if self.is_last else self.grad_outputs.pop(mb)
        if not wanted:  # a first stage without weights: nothing to compute
            self.weight_work[mb] = []
            return
        grads = torch.autograd.grad(out, wanted, grad_out, retain_graph=True, allow_unused=True)
        if not self.is_first:
            self.inputs.pop(mb)
            self.grad_inputs[mb] = grads[0]
            grads = grads[1:]
        work = [(y, params, dy) for (y, params), dy in zip(records, grads, strict=True) if dy is not None]
        self.weight_work[mb] = work
        self.saved_bytes[mb] = self.saved_bytes.get(mb, 0) + sum(dy.nbytes for _, _, dy in work)

    def backward_weight(self, mb: int) -> None:
        """W: each weighted layer's parameter gradients from its output and the output gradient B kept,
        added to `.grad`; then the microbatch's stash is freed."""
        for y, params, dy in self.weight_work.pop(mb):
            for q, g in zip(params, torch.autograd.grad(y, params, dy), strict=True):
                if q.grad is None:
                    q.grad = g
                else:
                    q.grad += g
        self.saved_bytes.pop(mb, None)

    def activation(self, mb: int) -> Tensor:
        """The output of microbatch `mb`'s forward, cut from the graph, for the next stage."""
        return self.outputs[mb].detach()

    def input_gradient(self, mb: int) -> Tensor:
        """The gradient of microbatch `mb`'s input, for the previous stage (taken out of the stash)."""
        return self.grad_inputs.pop(mb)

    @property
    def stashed(self) -> int:
        """How many microbatches have run forward and not yet backward (with a split backward: not yet
        W)."""
        return len(self.outputs) + len(self.weight_work)

    @property
    def stashed_bytes(self) -> int:
        """The bytes autograd saved for them."""
        return sum(self.saved_bytes.values())
