"""Less memory for the optimizer (Adafactor) and fewer bytes for the gradients (PowerSGD).

Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", ICML)
keeps, for an r x c weight matrix, not Adam's r x c second moment but its row sums and column sums,
r + c values, and rebuilds the matrix's estimate as their outer product over the total; it keeps no first
moment. Its state is 4 (r + c) bytes per matrix where Adam's is 8 r c. `torch.optim.Adafactor` is
PyTorch's version; `state_bytes` measures an optimizer's state and `adam_state_bytes` /
`adafactor_state_bytes` predict it; `train_curve` trains the chapter's task with either.

PowerSGD (Vogels, Karimireddy & Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS) all-reduces, for each n x m gradient matrix M, two thin matrices
instead of M: P = M Q (n x r), orthogonalised, and Q = M^T P (m x r), one step of power iteration warm-
started from the last step's Q. The rank-r approximation P Q^T replaces the average of M; what it
misses is added to the next step's gradient (error feedback), so nothing is lost for good. Traffic per
matrix drops from n m to r (n + m) values. `PowerSGD` is our DDP communication hook (its collectives
labelled "powersgd" for `distlab.comm_log`); PyTorch's is `torch.distributed.algorithms.ddp_comm_hooks.
powerSGD_hook`. (This module evaluates its annotations eagerly: DDP checks a hook's annotations
against `dist.GradBucket` and `Future[Tensor]` themselves.) `compare_compression` trains the same
model with plain all-reduce, ours and PyTorch's, and reports bytes sent and the final loss of each,
counted by `comm_log(all_threads=True)`: PyTorch's hook all-reduces P and Q in future callbacks on the
backend's thread, which a thread-local log would not see.
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from distlab.comm_log import comm_log, where
from distlab.memory.zero.parity import GLOBAL_BATCH, SEED
from distlab.reference import Task, group_mean, mlp_task, train_reference

OPTIMIZERS = {"adam": torch.optim.Adam, "adafactor": torch.optim.Adafactor}


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in `optimizer.state` (moments, factored moments, step counters)."""
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
               if isinstance(t, Tensor))


def adam_state_bytes(model: nn.Module) -> int:
    """Adam's state in fp32: m and v, 8 bytes per parameter, and a 4-byte step per tensor."""
    return sum(8 * p.numel() + 4 for p in model.parameters())


def adafactor_state_bytes(model: nn.Module) -> int:
    """Adafactor's state in fp32: r + c values per matrix (row and column variances), n per vector (a
    full variance), and a 4-byte step per tensor (Shazeer & Stern 2018, sec. 3)."""
    return sum(4 * (sum(p.shape) if p.dim() == 2 else p.numel()) + 4 for p in model.parameters())


def compression_task() -> Task:
    """The section's task: regression with the MLP of widths (16, 64, 64, 4), 5508 parameters, on 96
    examples (`distlab.reference.mlp_task`), in global batches of `zero.parity.GLOBAL_BATCH`."""
    return mlp_task(sizes=(16, 64, 64, 4), n=96, seed=SEED)


def train_curve(optimizer: str, task: Task | None = None, steps: int = 60, lr: float = 1e-2) -> list[float]:
    """One process: the loss at every step of training `task` (default: `compression_task`) with
    `optimizer` (the course's single-process loop, `reference.train_reference`)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is unknown; choose one of {', '.join(OPTIMIZERS)}")
    task = task or compression_task()
    model = task.build(SEED)
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=lr)
    return train_reference(model, task.batches(steps, GLOBAL_BATCH, SEED), task.loss, opt).losses


# ---------------------------------------------------------------- PowerSGD, our own


@dataclass
class PowerSGD:
    """Rank-`rank` PowerSGD with error feedback and warm start, as a DDP communication hook
    (`ddp.register_comm_hook(state, PowerSGD.hook)`): Vogels et al. 2019, Algorithm 1. Matrices where
    r (n + m) is not smaller than n m, and all vectors, are all-reduced as they are. Its collectives are
    labelled "powersgd/P", "powersgd/Q" and "powersgd/vector" in an open `distlab.comm_log`."""

    group: dist.ProcessGroup | None = None
    rank: int = 1
    seed: int = 0
    errors: dict[tuple[int, int], Tensor] = field(default_factory=dict)
    qs: dict[tuple[int, int], Tensor] = field(default_factory=dict)

    def _compress(self, key: tuple[int, int], m: Tensor, n_ranks: int) -> Tensor:
        """The rank-r average of the matrix `m` over the group; keeps the error for the next step."""
        m = m + self.errors.get(key, 0)
        if key not in self.qs:  # the same random start on every rank
            g = torch.Generator().manual_seed(self.seed + key[1])
            self.qs[key] = torch.randn(m.shape[1], self.rank, generator=g)
        p = m @ self.qs[key]
        with where("P"):
            dist.all_reduce(p, group=self.group)
        p, _ = torch.linalg.qr(p / n_ranks)  # orthonormal columns (the paper's Gram-Schmidt)
        q = m.t() @ p
        with where("Q"):
            dist.all_reduce(q, group=self.group)
        q /= n_ranks
        self.qs[key] = q
        approx = p @ q.t()
        self.errors[key] = m - approx
        return approx

    @staticmethod
    def hook(state: "PowerSGD", bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
        """DDP calls this with each bucket of gradients; returns the averaged bucket."""
        n = dist.get_world_size(state.group)
        out = []
        with where("powersgd"):
            for i, g in enumerate(bucket.gradients()):
                rows, cols = (g.shape[0], g[0].numel()) if g.dim() >= 2 else (1, g.numel())
                if g.dim() >= 2 and state.rank * (rows + cols) < rows * cols:
                    approx = state._compress((bucket.index(), i), g.reshape(rows, cols), n)
                    out.append(approx.reshape(g.shape))
                else:
                    flat = g.clone()
                    with where("vector"):
                        dist.all_reduce(flat, group=state.group)
                    out.append(flat / n)
        result = torch.cat([t.reshape(-1) for t in out])
        future: torch.futures.Future[Tensor] = torch.futures.Future()
        future.set_result(result)
        return future


@dataclass
class AllReduce:
    """Plain data parallelism as a comm hook (`ddp.register_comm_hook(state, AllReduce.hook)`), made the
    same way as ours: the bucket's average over `group` (None: the whole world), labelled "bucket"."""

    group: dist.ProcessGroup | None = None

    @staticmethod
    def hook(state: "AllReduce", bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
        flat = bucket.buffer().clone()
        with where("bucket"):
            dist.all_reduce(flat, group=state.group)
        future: torch.futures.Future[Tensor] = torch.futures.Future()
        future.set_result(flat / dist.get_world_size(state.group))
        return future


@dataclass(frozen=True)
class CompressionResult:
    """One method on the ranks: bytes each rank sent per step (ring count, rounded to a byte) and the final
    global loss."""

    method: str
    sent_bytes_per_step: int
    final_loss: float


def _ddp(method: str, model: nn.Module, rank: int) -> nn.Module:
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    if method == "allreduce":
        ddp.register_comm_hook(AllReduce(), AllReduce.hook)
    elif method == "ours":
        ddp.register_comm_hook(PowerSGD(rank=rank), PowerSGD.hook)
    else:  # PyTorch's: compress from the second step on (the earliest it allows)
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                                            min_compression_rate=1)
        ddp.register_comm_hook(state, torch_powersgd_hook)
    return ddp


def torch_powersgd_hook(state: powerSGD_hook.PowerSGDState,
                        bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """PyTorch's PowerSGD hook, also for CPU buckets in a process that sees a GPU.

    Its decompression ends with `torch.cuda.synchronize(device)` whenever CUDA is available, with the
    bucket's device, which fails for a CPU bucket ("Expected a cuda device, but got: cpu"): gloo ranks
    on a GPU node. For a CPU bucket that call is replaced, while this bucket's hook runs, by one that
    skips CPU devices, and the hook's future is waited for, so that its callbacks (which make the call,
    on the backend's thread) finish inside. A CUDA bucket runs the hook as it is."""
    if bucket.buffer().device.type == "cuda" or not torch.cuda.is_available():
        return powerSGD_hook.powerSGD_hook(state, bucket)
    synchronize = torch.cuda.synchronize

    def cuda_only(device: object = None) -> None:
        if device is None or torch.device(device).type == "cuda":  # type: ignore[arg-type]
            synchronize(device)  # type: ignore[arg-type]

    torch.cuda.synchronize = cuda_only  # type: ignore[assignment]
    try:
        future = powerSGD_hook.powerSGD_hook(state, bucket)
        future.wait()
    finally:
        torch.cuda.synchronize = synchronize  # type: ignore[assignment]
    return future


def compare_compression(methods: tuple[str, ...] = ("allreduce", "ours", "pytorch"), rank: int = 2,
                        steps: int = 60, lr: float = 1e-2,
                        task: Task | None = None) -> list[CompressionResult]:
    """Inside the ranks (whole world): train the task with DDP and each method's gradient exchange,
    with Adam, and report the bytes of the gradient all-reduces sent per step (averaged over steps;
    `comm_log(all_threads=True)` also sees those PyTorch's hook makes on gloo's thread) and the final
    loss."""
    task = task or compression_task()
    results = []
    for method in methods:
        model = task.build(SEED)
        ddp = _ddp(method, model, rank)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        with comm_log(all_threads=True) as log:
            loss = _train_ddp(ddp, opt, task, steps)
        sent = log.sent_bytes(op="all_reduce")  # not DDP's broadcasts of its buckets' layout
        results.append(CompressionResult(method, round(sent / steps), group_mean(loss, None)))
    return results


def _train_ddp(ddp: nn.Module, opt: torch.optim.Optimizer, task: Task, steps: int) -> Tensor:
    """Train for `steps`; return this rank's last loss."""
    loss = torch.zeros(())
    for step in range(steps):
        x, y = task.batch(step, GLOBAL_BATCH, SEED)
        opt.zero_grad()
        loss = task.shard_backward(ddp, x, y, dist.get_rank(), dist.get_world_size())
        opt.step()
    return loss
