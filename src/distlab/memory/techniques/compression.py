"""Less memory for the optimizer (Adafactor) and fewer bytes for the gradients (PowerSGD).

Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", ICML)
keeps, for an r x c weight matrix, not Adam's r x c second moment but its row sums and column sums,
r + c values, and rebuilds the matrix's estimate as their outer product over the total; it keeps no first
moment. Its state is 4 (r + c) bytes per matrix where Adam's is 8 r c. `torch.optim.Adafactor` is
PyTorch's version; `state_bytes` measures an optimizer's state and `adam_state_bytes` /
`adafactor_state_bytes` predict it; `train_curve` trains the chapter's task with either.

PowerSGD (Vogels, Karimireddy & Jaggi 2019) sends, for each gradient matrix, two thin factors instead of
the matrix; it lives beside chapter 2's other gradient exchanges, `distlab.data_parallel.powersgd`, and
chapter 11 trains with it too. `compare_compression` trains the same model with plain all-reduce, our
PowerSGD and PyTorch's, and reports bytes sent and the final loss of each, counted by
`comm_log(all_threads=True)`: PyTorch's hook all-reduces P and Q in future callbacks on the backend's
thread, which a thread-local log would not see. (This module evaluates its annotations eagerly, as DDP's
hooks need.)
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from distlab.comm_log import comm_log
from distlab.data_parallel.powersgd import AllReduce, PowerSGD, torch_powersgd_hook
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
