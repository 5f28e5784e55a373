"""PowerSGD: fewer bytes for data parallelism's gradients, as a DDP communication hook.

PowerSGD (Vogels, Karimireddy & Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS) all-reduces, for each n x m gradient matrix M, two thin matrices
instead of M: P = M Q (n x r), orthogonalised, and Q = M^T P (m x r), one step of power iteration warm-
started from the last step's Q. The rank-r approximation P Q^T replaces the average of M; what it
misses is added to the next step's gradient (error feedback), so nothing is lost for good. Traffic per
matrix drops from n m to r (n + m) values. `PowerSGD` is our DDP communication hook (its collectives
labelled "powersgd" for `distlab.comm_log`); `AllReduce` is plain data parallelism made the same way;
PyTorch's is `torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`, which `torch_powersgd_hook`
runs on CPU buckets of a process that sees a GPU too. (This module evaluates its annotations eagerly:
DDP checks a hook's annotations against `dist.GradBucket` and `Future[Tensor]` themselves.)

Chapter 7 compares the three on its task (`distlab.memory.techniques.compression.compare_compression`);
chapter 11 trains with ours beside its other ways to send less (`fault_tolerance.powersgd_run`).
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from distlab.comm_log import where


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
