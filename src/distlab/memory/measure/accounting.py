"""Where the memory of one training step goes, measured exactly on any device (CPU included).

A training step holds four kinds of bytes (Rajbhandari et al. 2020, "ZeRO", sec. 3):

- **model states**: the parameters, their gradients and the optimizer's state (Adam's m and v);
- **activations**: the tensors that forward saves for backward (Chen et al. 2016 call them the feature
  maps); autograd keeps them from the moment an op saves them until backward has used them;
- **temporary buffers**: everything else that is alive for a while: an op's output before the next op
  consumes it, the gradient flowing backward, the optimizer's scratch space.

Two instruments count them, with no guessing:

1. `torch.autograd.graph.saved_tensors_hooks` sees every tensor an op saves for backward. Several saved
   tensors can be views of one storage (q, k and v are slices of one matmul output), so we count each
   *storage* once, by `untyped_storage().data_ptr()`, and we leave out the parameters' storages, which
   are model states.
2. `LiveBytes`, a `TorchDispatchMode`, sees every tensor every op creates, forward, backward and the
   optimizer's, and keeps a running sum of the bytes of the storages still alive (a storage leaves when
   Python frees it). Its maximum is the step's peak: on CUDA the same number as
   `torch.cuda.max_memory_allocated` up to the allocator's rounding (`cuda_peak_check` compares them).

At the peak, `LiveBytes` knows which storages were alive, so the peak splits exactly into parameters,
gradients, optimizer state, saved activations and temporaries (whatever is left).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

PHASES = ("forward", "backward", "optimizer")


class LiveBytes(TorchDispatchMode):
    """Count the bytes of the storages that ops create and that are still alive; remember the peak.

    Each storage gets an allocation number when it first appears; `peak_live` maps the allocation numbers
    alive at the peak to their bytes, so that the peak can be split by kind afterwards (`ids_of`).
    Storages that exist before the mode starts (parameters, optimizer state) are added with `adopt`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[int, int]] = {}  # data_ptr -> (allocation number, bytes)
        self.current = 0
        self.peak = 0
        self.peak_live: dict[int, int] = {}
        self.peak_phase = PHASES[0]
        self.phase = PHASES[0]
        self._next = 0

    def adopt(self, tensors: Iterable[Tensor]) -> None:
        """Count storages that already exist (the parameters, the optimizer state) as alive."""
        for t in tensors:
            self._add(t)

    def _add(self, t: Tensor) -> None:
        storage = t.untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or key in self.live or t.device.type == "meta":
            return
        self.live[key] = (self._next, nbytes)
        self._next += 1
        self.current += nbytes
        weakref.finalize(storage, self._free, key)
        if self.current > self.peak:
            self.peak = self.current
            self.peak_live = dict(self.live.values())
            self.peak_phase = self.phase

    def _free(self, key: int) -> None:
        _, nbytes = self.live.pop(key)
        self.current -= nbytes

    def ids_of(self, tensors: Iterable[Tensor]) -> set[int]:
        """The allocation numbers of the storages of `tensors` that are alive now."""
        out = set()
        for t in tensors:
            entry = self.live.get(t.untyped_storage().data_ptr())
            if entry is not None:
                out.add(entry[0])
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor):
                self._add(t)
        return out


@dataclass
class SavedTensors:
    """The storages that forward saved for backward, each once: data_ptr -> bytes, parameters left out."""

    params: set[int]
    storages: dict[int, int] = field(default_factory=dict)
    tensors: list[Tensor] = field(default_factory=list)  # kept only while a LiveBytes needs their ids

    def pack(self, t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.params:
            self.storages.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())


def saved_activation_bytes(fn: Callable[[], object], params: Iterable[Tensor] = ()) -> int:
    """Bytes of the distinct storages that `fn()` saves for backward, leaving out those of `params`.

    Each storage counts once however many views of it are saved (Korthikanti et al. 2022, sec. 4, count
    the same tensors by hand). The result of `fn` is dropped afterwards, which frees the saved tensors.
    """
    saved = SavedTensors({p.untyped_storage().data_ptr() for p in params})
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        fn()
    return saved.nbytes


@dataclass
class StepMemory:
    """The bytes of one training step, split by kind. `peak_*` split the highest live total."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int  # saved for backward at the end of forward
    peak_bytes: int
    peak_phase: str
    peak_params_bytes: int
    peak_grads_bytes: int
    peak_optimizer_bytes: int
    peak_activations_bytes: int
    peak_temporary_bytes: int

    @property
    def model_states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def _storages_bytes(tensors: Iterable[Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
    return sum(seen.values())


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """Every tensor of the optimizer's state (Adam: step, exp_avg, exp_avg_sq per parameter). An object
    with a `state_tensors()` method (`precision.MasterWeights`, a sharded optimizer) reports its own."""
    if hasattr(optimizer, "state_tensors"):
        return list(optimizer.state_tensors())
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, Tensor)]


def measure_step(
    model: nn.Module,
    loss_fn: Callable[[nn.Module], Tensor],
    optimizer: torch.optim.Optimizer,
    warmup: int = 1,
    after_backward: Callable[[], None] | None = None,
    tracker: LiveBytes | None = None,
) -> StepMemory:
    """Run `warmup` ordinary steps (so that the optimizer's state exists), then one step under
    `LiveBytes` (or `tracker`, a subclass) and the saved-tensor hooks, and split its memory by kind.
    `after_backward` runs between backward and the optimizer's step (a gradient reduction).

    A step is `zero_grad(set_to_none=True)`, `loss_fn(model).backward()`, `optimizer.step()`, so the
    gradients of the previous step are gone during forward, as in a usual training loop. `loss_fn` must
    return only the loss (keeping the logits alive would add them to the temporaries).
    """
    params = list(model.parameters())
    for _ in range(warmup):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model).backward()
        if after_backward is not None:
            after_backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tracker = LiveBytes() if tracker is None else tracker
    tracker.adopt(params)
    tracker.adopt(optimizer_tensors(optimizer))
    param_ids, state_ids = tracker.ids_of(params), tracker.ids_of(optimizer_tensors(optimizer))
    saved = SavedTensors({p.untyped_storage().data_ptr() for p in params})
    saved_ids: set[int] = set()

    def pack(t: Tensor) -> Tensor:
        saved.pack(t)
        saved_ids.update(i for i in tracker.ids_of([t]) if i not in param_ids)
        return t

    with tracker:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(model)
        tracker.phase = "backward"
        loss.backward()
        del loss
        if after_backward is not None:
            after_backward()
        grads = [p.grad for p in params if p.grad is not None]
        grad_ids = tracker.ids_of(grads)
        tracker.phase = "optimizer"
        optimizer.step()
        state_ids |= tracker.ids_of(optimizer_tensors(optimizer))

    def at_peak(ids: set[int]) -> int:
        return sum(n for i, n in tracker.peak_live.items() if i in ids)

    kinds = [at_peak(param_ids), at_peak(grad_ids), at_peak(state_ids), at_peak(saved_ids - grad_ids)]
    return StepMemory(
        params_bytes=_storages_bytes(params),
        grads_bytes=_storages_bytes(grads),
        optimizer_bytes=_storages_bytes(optimizer_tensors(optimizer)),
        activations_bytes=saved.nbytes,
        peak_bytes=tracker.peak,
        peak_phase=tracker.peak_phase,
        peak_params_bytes=kinds[0],
        peak_grads_bytes=kinds[1],
        peak_optimizer_bytes=kinds[2],
        peak_activations_bytes=kinds[3],
        peak_temporary_bytes=tracker.peak - sum(kinds),
    )


def cuda_peak_check(
    model: nn.Module, loss_fn: Callable[[nn.Module], Tensor], optimizer: torch.optim.Optimizer
) -> tuple[StepMemory, int]:
    """On CUDA: the step's `StepMemory` beside `torch.cuda.max_memory_allocated` for the same step.

    The CUDA caching allocator rounds every block up to a multiple of 512 bytes and counts everything
    on the device (the batch too), so the two agree up to that rounding and the batch's bytes.
    """
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise ValueError(
            f"cuda_peak_check needs a model on a CUDA device, not on {device}; on CPU use "
            "measure_step, whose LiveBytes peak is the same measurement"
        )
    measure_step(model, loss_fn, optimizer, warmup=1)  # the optimizer's state now exists
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    memory = measure_step(model, loss_fn, optimizer, warmup=0)
    torch.cuda.synchronize(device)
    return memory, torch.cuda.max_memory_allocated(device)


def gpt_loss_fn(idx: Tensor, targets: Tensor) -> Callable[[nn.Module], Tensor]:
    """A `loss_fn` for `measure_step`: the GPT's loss on one fixed batch, the logits dropped."""

    def loss_fn(model: nn.Module) -> Tensor:
        return model(idx, targets)[1]

    return loss_fn


def measure_gpt_step(
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    batch: int,
    seq: int,
    precision: str = "fp32",
    recompute: str = "none",
    seed: int = 0,
    bias: bool = True,
    adam: str = "for-loop",
) -> StepMemory:
    """`measure_step` of one training step of `distlab.models.GPT` with Adam on a random batch:
    `precision="fp32"`, or `"mixed"`, a bf16 model with fp32 master weights (`precision.MasterWeights`,
    Micikevicius et al. 2018); `recompute` is a named policy of `recompute.policy_plan`; `adam` is the
    implementation (`optimizer_step.FORMS`: "for-loop", "foreach", "fused"; "default" is torch's on CPU)."""
    from distlab.memory.estimate.optimizer_step import adam_form, adam_kwargs
    from distlab.memory.techniques.precision import MasterWeights
    from distlab.memory.techniques.recompute import policy_plan, recompute_forward
    from distlab.models import GPT, GPTConfig

    if precision not in ("fp32", "mixed"):
        raise ValueError(
            f"precision={precision!r} is unknown; choose 'fp32' or 'mixed' (bf16 + fp32 masters)"
        )
    kwargs = adam_kwargs(adam_form(adam, "cpu"))
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=vocab, block_size=seq, n_layer=layers, n_head=heads, n_embd=hidden, bias=bias
    )
    model = GPT(config)
    g = torch.Generator().manual_seed(seed)
    idx, y = (torch.randint(vocab, (batch, seq), generator=g) for _ in range(2))
    plan = policy_plan(recompute, layers)
    if precision == "mixed":
        model = model.to(torch.bfloat16)
        optimizer = MasterWeights(model, lambda ps: torch.optim.Adam(ps, lr=1e-3, **kwargs))
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **kwargs)
    return measure_step(model, lambda m: recompute_forward(m, idx, y, plan=plan)[1], optimizer)
