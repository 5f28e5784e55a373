"""The bytes one rank holds in a step, counted on tensors that have shapes but no data.

Chapter 7's instruments (`distlab.memory.measure.accounting`) count storages by their address; on the meta
device every storage has address 0, so `LiveBytes` skips them. This file counts the same four kinds
(Rajbhandari et al. 2020, sec. 3) by storage *identity* instead (the C++ storage a tensor points to,
`untyped_storage()._cdata`), which works for meta, fake and real tensors alike:

- parameters: the distinct storages of the model's parameters (chapter 7's ZeRO keeps each unit's
  parameters as views of one flat buffer, padded to a multiple of dp elements);
- gradients: the distinct `.grad` storages once backward has filled them (a post-accumulate hook per
  parameter sees each);
- optimizer state: Adam's m and v of this rank's ZeRO shard (`ShardAdam.state_tensors`);
- activations: the peak of what autograd saved for the micro-batches in flight, as chapter 4's executor
  measures it (`RankRun.peak_stash_bytes`: each stage's saved tensors counted once per storage view,
  weights left out, from a micro-batch's forward to its backward), keyed by storage identity on meta.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch import Tensor, nn

from distlab.memory.zero import ZeRO

__all__ = ["HeldBytes", "gradient_watch", "model_state_bytes"]


def storage_key(t: Tensor) -> int:
    """The identity of `t`'s storage (its C++ StorageImpl), valid on the meta device too."""
    return t.untyped_storage()._cdata


def _distinct_bytes(tensors: list[Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        seen.setdefault(storage_key(t), t.untyped_storage().nbytes())
    return sum(seen.values())


@dataclass(frozen=True)
class HeldBytes:
    """What one rank holds, in bytes, by kind (activations: the peak of the saved tensors)."""

    params: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations

    def to_dict(self) -> dict[str, int]:
        return asdict(self) | {"total": self.total}


class gradient_watch:
    """Remember every `.grad` storage the model's parameters accumulate into while open."""

    def __init__(self, model: nn.Module) -> None:
        self.grads: dict[int, int] = {}
        self._handles = [p.register_post_accumulate_grad_hook(self._seen) for p in model.parameters()]

    def _seen(self, p: Tensor) -> None:
        self.grads.setdefault(storage_key(p.grad), p.grad.untyped_storage().nbytes())

    @property
    def nbytes(self) -> int:
        return sum(self.grads.values())

    def __enter__(self) -> gradient_watch:
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()


def model_state_bytes(model: nn.Module, zero: ZeRO) -> tuple[int, int]:
    """(parameter bytes, optimizer-state bytes) of this rank: the parameters' distinct storages and Adam's
    state of its ZeRO shards."""
    state = [t for unit in zero.units for t in unit.adam.state_tensors()]
    return _distinct_bytes(list(model.parameters())), _distinct_bytes(state)
