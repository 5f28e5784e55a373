"""The peak of one ZeRO training step on each rank (Rajbhandari et al. 2020, sec. 5), predicted tensor by
tensor and measured.

Chapter 7's engine (`zero.ZeRO`) keeps, per unit (one layer, one flat padded buffer of Psi_u elements cut
into N shards), the flat parameters, this rank's shard, a gradient buffer and Adam's m and v. What each
stage keeps between steps (fp32, N ranks):

| stage | parameters | gradient buffer | Adam state |
| --- | --- | --- | --- |
| 0 | Psi_u | Psi_u | 2 Psi_u |
| 1 | Psi_u | Psi_u | 2 Psi_u / N |
| 2 | Psi_u | Psi_u / N | 2 Psi_u / N |
| 3 | Psi_u / N (the flat buffer only while gathered) | Psi_u / N | 2 Psi_u / N |

During the step more is alive: autograd's gradients until the hook copies them into the buffer; in
stages 2 and 3 a unit's full gradient buffer from its first gradient until its reduce-scatter has
finished (one unit in flight while the next fills); in stage 3 the gathered unit and the prefetched next
one; in the step, Adam's sqrt(v) and denominator per unit, the reduce-scattered gradient (stage 1) and the
shard's copy that is all-gathered (stages 1-2). `predict_zero_peak` follows the course's MLP
(`Linear, ReLU, Linear`, `mse_loss`) through that, op by op, with `peak.Timeline`; `measure_zero_step`
runs it on a rank under `accounting.LiveBytes`, made aware of storages that stage 3 resizes in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distlab.memory.estimate.timeline import Timeline
from distlab.memory.measure.accounting import LiveBytes

STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class ZeroPeak:
    """One rank's peak of a ZeRO step: bytes and the phase it falls in."""

    stage: int
    peak_bytes: int
    phase: str


def _padded(numel: int, n: int) -> int:
    return -(-numel // n) * n


def unit_sizes(dims: tuple[int, int, int]) -> list[int]:
    """Elements of each unit (a Linear with its bias) of `mlp(dims)`, in forward order."""
    d0, d1, d2 = dims
    return [d0 * d1 + d1, d1 * d2 + d2]


def mlp(dims: tuple[int, int, int], seed: int = 0) -> nn.Sequential:
    """The step's model: Linear(d0, d1), ReLU, Linear(d1, d2); its two Linears are ZeRO's units."""
    torch.manual_seed(seed)
    d0, d1, d2 = dims
    return nn.Sequential(nn.Linear(d0, d1), nn.ReLU(), nn.Linear(d1, d2))


def _check(stage: int, dims: tuple[int, int, int], batch: int, n: int) -> None:
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not a ZeRO stage; choose one of {STAGES}")
    if len(dims) != 3 or min(dims) < 1 or batch < 1 or n < 1:
        raise ValueError(f"dims={dims}, batch={batch}, n={n}: give three positive widths, batch >= 1, n >= 1")


class _ZeroStep:
    """The timeline of one step of `mlp(dims)` under `ZeRO(stage)` on one of n ranks, fp32."""

    def __init__(self, stage: int, dims: tuple[int, int, int], batch: int, n: int) -> None:
        self.stage, self.n, self.b, self.dims = stage, n, batch, dims
        self.full = [4 * _padded(u, n) for u in unit_sizes(dims)]  # bytes of each unit's flat buffer
        self.shard = [f // n for f in self.full]
        self.tl = Timeline()

    def states(self) -> None:
        tl, s = self.tl, self.stage
        for u, (full, shard) in enumerate(zip(self.full, self.shard, strict=True)):
            tl.alloc(f"shard{u}" if s == 3 else f"flat{u}", shard if s == 3 else full, "params")
            tl.alloc(f"gradbuf{u}", full if s <= 1 else shard, "grads")
            tl.alloc(f"adam{u}", 2 * (full if s == 0 else shard), "optimizer")

    def gather(self, u: int) -> None:
        if self.stage == 3 and 0 <= u < len(self.full):
            self.tl.free(f"gathered{u}")  # already gathered (the prefetch): nothing new
            self.tl.alloc(f"gathered{u}", self.full[u], "params")

    def release(self, u: int) -> None:
        if self.stage == 3:
            self.tl.free(f"gathered{u}")

    def forward(self) -> None:
        tl, (_, d1, d2), b = self.tl, self.dims, self.b
        tl.where = "forward"
        self.gather(0)
        self.gather(1)  # prefetched
        tl.alloc("a1", 4 * b * d1)  # the first Linear's output
        self.release(0)
        tl.alloc("relu", 4 * b * d1, "activations")
        tl.free("a1")
        tl.alloc("out", 4 * b * d2, "activations")
        self.release(1)
        tl.alloc("mse.saved", 4 * b * d2, "activations")  # what mse_loss keeps for its backward

    def grads(self, u: int, weight: int, bias: int, grad_out: str) -> None:
        """Autograd's gradients of unit u; the node then drops its incoming gradient `grad_out`, before
        the hooks run: each copies its gradient into the buffer (stages 2-3: a full buffer made on the
        first) and autograd's is freed; stages 2-3 then start the unit's reduce-scatter."""
        tl = self.tl
        tl.alloc(f"g.W{u}", 4 * weight)
        tl.alloc(f"g.b{u}", 4 * bias)
        tl.free(grad_out)
        if self.stage >= 2:
            tl.alloc(f"gradfull{u}", self.full[u])
        tl.free(f"g.W{u}", f"g.b{u}")
        if self.stage >= 2:
            tl.free(f"gradfull{u + 1}")  # the one in flight has finished
            self.release(u)

    def backward(self) -> None:
        tl, (d0, d1, d2), b = self.tl, self.dims, self.b
        tl.phase, tl.where = "backward", "backward"
        tl.alloc("d.loss", 4)
        tl.alloc("d.out", 4 * b * d2)
        tl.free("mse.saved")
        self.gather(1)
        self.gather(0)  # prefetched
        tl.alloc("d.relu", 4 * b * d1)
        self.grads(1, d1 * d2, d2, "d.out")
        tl.alloc("d.a1", 4 * b * d1)
        tl.free("d.relu", "relu")
        self.grads(0, d0 * d1, d1, "d.a1")
        tl.free("d.loss", "out")

    def step(self) -> None:
        tl = self.tl
        tl.phase, tl.where = "optimizer", "step"
        tl.free("gradfull0")
        for u, shard in enumerate(self.shard):
            numel = self.full[u] if self.stage == 0 else shard
            if self.stage == 1:
                tl.alloc(f"rs{u}", shard)  # the reduce-scattered gradient, alive until the next one
                tl.free(f"rs{u - 1}")
            tl.alloc(f"sqrt{u}", numel)
            tl.alloc(f"denom{u}", numel)
            tl.free(f"sqrt{u}", f"denom{u}")
            if self.stage in (1, 2):
                tl.alloc(f"clone{u}", shard)  # the shard's copy, all-gathered into the flat buffer
                tl.free(f"clone{u}")
        tl.free(f"rs{len(self.shard) - 1}")


def predict_zero_peak(stage: int, dims: tuple[int, int, int], batch: int, n: int = 2) -> ZeroPeak:
    """The peak bytes of one step of `mlp(dims)` on a micro-batch of `batch` rows under `zero.ZeRO`
    (stage 0-3, N = n ranks, fp32, Adam), on one rank (every rank holds the same sizes)."""
    _check(stage, dims, batch, n)
    z = _ZeroStep(stage, dims, batch, n)
    z.states()
    z.forward()
    z.backward()
    z.step()
    return ZeroPeak(stage, z.tl.peak, z.tl.peak_phase)


class ResizingLiveBytes(LiveBytes):
    """`LiveBytes` for a rank that runs collectives, with two changes.

    It follows `watched` tensors whose storage is resized in place (stage 3 frees and re-allocates its
    flat buffers with `storage.resize_`, which no dispatched op reports): before each op, a watched
    storage's bytes are brought up to date. And a view op adds nothing, since it allocates nothing:
    gloo's reduce-scatter copies its input into a buffer of its own inside the collective, where no op
    is dispatched, and the rank may then see views of that buffer, freed whenever gloo drops its work
    (sometimes after `wait()` has returned). Counting such a view as a new storage made the stage-1 peak
    jump by a whole unit at random. The backend's own buffers are outside the prediction and this
    measurement alike, as NCCL's are outside `torch.cuda.max_memory_allocated`.
    """

    def __init__(self, watched: list[Tensor]) -> None:
        super().__init__()
        self.watched = watched
        self.seen: dict[int, tuple[int, int]] = {}

    def _free(self, key: int) -> None:
        entry = self.live.pop(key, None)  # a resized storage may already have left
        if entry is not None:
            self.current -= entry[1]

    def sync(self) -> None:
        for i, t in enumerate(self.watched):
            storage = t.untyped_storage()
            now = (storage.data_ptr(), storage.nbytes())
            before = self.seen.get(i)
            if before == now:
                continue
            if before is not None:
                self._free(before[0])
            self.seen[i] = now
            self._add(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view:  # a view allocates nothing
            return func(*args, **(kwargs or {}))
        self.sync()
        return super().__torch_dispatch__(func, types, args, kwargs)


def measure_zero_step(stage: int, dims: tuple[int, int, int], batch: int, group=None) -> ZeroPeak:
    """On a rank: one warm-up step of `mlp(dims)` under `zero.ZeRO(stage, group=)`, then one step
    measured (`zero_grad`, forward, backward, `step`); its peak and phase."""
    from distlab.memory.zero import ZeRO

    _check(stage, dims, batch, 1)
    model = mlp(dims)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, dims[0], generator=g), torch.randn(batch, dims[2], generator=g)
    zero = ZeRO(model, stage, group=group)

    def step() -> None:
        F.mse_loss(model(x), y).backward()
        zero.step()
        zero.zero_grad()

    step()
    tracker = ResizingLiveBytes([u.flat for u in zero.units])
    tracker.sync()
    tracker.adopt(zero.state_tensors())
    with tracker:
        loss = F.mse_loss(model(x), y)
        tracker.phase = "backward"
        loss.backward()
        del loss
        tracker.phase = "optimizer"
        zero.step()
        zero.zero_grad()
    zero.remove()
    return ZeroPeak(stage, tracker.peak, tracker.peak_phase)
