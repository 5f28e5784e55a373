"""ZeRO-Offload: the optimizer's state and its step on the host; and activations offloaded to the host.

Ren et al. 2021 ("ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX ATC) keep on the GPU
only what the forward and backward need (the parameters, and gradients until they leave), and move to
CPU memory the rest of the model states: the fp32 master parameters and Adam's two moments, 12 of the
16 bytes per parameter of mixed-precision Adam (2 + 2 + K with K = 12). The step runs on the CPU. Per
step the PCIe link carries the gradients down (device -> host, 2 Psi bytes in fp16) and the updated
parameters back up (host -> device, 2 Psi): the least traffic of any split that puts the step on the CPU
(sec. 4.1). Gradients leave as soon as they are produced, on a side CUDA stream into pinned (page-locked)
host buffers, so the copies overlap the rest of the backward (sec. 4.2).

`HostShard` is that for one flat shard (`zero.ZeRO(offload=True)` makes one per unit). On a machine with
no GPU the host and the "device" are the same memory: the same code runs, with plain copies instead of
stream copies, which is how its correctness is tested here.

`predict_offload_step` is the transfer model: the GPU-side step time for a parameter count and a PCIe
generation, read from `distlab.catalog`. `offload_activations` moves the tensors autograd saves for the
backward to the host and back (PyTorch's saved-tensor hooks; `torch.autograd.graph.save_on_cpu` is the
built-in form).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from distlab import catalog
from distlab.memory.zero.flat import AdamConfig, ShardAdam

# Host bytes per element of a shard: fp32 master copy 4, Adam's m and v 8, the gradient's landing buffer 4.
HOST_BYTES_PER_ELEMENT = 4 + 8 + 4


def available_host_bytes() -> int:
    """Host memory available to a new allocation now: MemAvailable from /proc/meminfo (Linux), else the
    free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_host_room(needed: int, available: int | Callable[[], int] | None = None) -> None:
    """Raise MemoryError naming the bytes when `needed` bytes of host memory are not `available`."""
    have = available_host_bytes() if available is None else available() if callable(available) else available
    if needed > have:
        raise MemoryError(
            f"offload=True needs {needed:,} bytes of host memory on this rank for the optimizer state "
            f"(fp32 master parameters, Adam's two moments and a gradient buffer: {HOST_BYTES_PER_ELEMENT} "
            f"bytes per parameter of this rank's shard), but only {have:,} bytes are available; shard the "
            "state over more ranks (a larger data-parallel group, or ZeRO stage >= 1), free host memory, "
            "or use offload=False")


class HostShard:
    """One flat shard's optimizer on the host: master parameters, Adam state, the step, the copies.

    `grad_to_host` starts the device -> host copy of the averaged gradient shard (on a side stream on
    CUDA, so the backward continues); `step_into` waits for it, runs Adam on the host, and copies the
    updated parameters host -> device into `device_shard`.
    """

    def __init__(self, device_shard: Tensor, config: AdamConfig) -> None:
        self.device = device_shard.device
        cuda = self.device.type == "cuda"
        self.master = torch.empty(device_shard.numel(), dtype=torch.float32, pin_memory=cuda)
        self.master.copy_(device_shard.detach().reshape(-1))
        self.grad = torch.zeros(device_shard.numel(), dtype=torch.float32, pin_memory=cuda)
        self.adam = ShardAdam(device_shard.numel(), config, "cpu")
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.copied: torch.cuda.Event | None = None

    def tensors(self) -> list[Tensor]:
        """Everything this shard keeps on the host."""
        return [self.master, self.grad, *self.adam.state_tensors()]

    def grad_to_host(self, grad_shard: Tensor) -> None:
        """Start copying `grad_shard` (on the device) into the pinned host buffer."""
        if self.stream is None:
            self.grad.copy_(grad_shard)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the gradient is ready
        with torch.cuda.stream(self.stream):
            self.grad.copy_(grad_shard, non_blocking=True)
            grad_shard.record_stream(self.stream)  # keep its memory until the copy has read it
            self.copied = torch.cuda.Event()
            self.copied.record(self.stream)

    def step_into(self, device_shard: Tensor, active: Sequence[bool] | None = None) -> None:
        """Adam on the host (parameter j only where `active[j]`, see `ShardAdam.step`), then the new
        parameters host -> device into `device_shard`."""
        if self.copied is not None:
            self.copied.synchronize()
        self.adam.step(self.master, self.grad, active)
        if self.stream is None:
            device_shard.copy_(self.master)
            return
        # the copy overwrites device_shard: first let the kernels queued on the compute stream that still
        # read it (the end of the backward) finish
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            device_shard.copy_(self.master, non_blocking=True)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)


# ---------------------------------------------------------------- the transfer model


@dataclass(frozen=True)
class OffloadPrediction:
    """One step with ZeRO-Offload, in seconds, on the GPU's side of the link."""

    forward_s: float
    backward_s: float
    grads_down_s: float  # device -> host over PCIe
    host_step_s: float
    params_up_s: float  # host -> device over PCIe

    @property
    def step_s(self) -> float:
        """forward + max(backward, gradients down) + host step + parameters up: the gradient copy overlaps
        the backward; the step and the copy back do not (Ren et al. 2021 hide them too with a one-step
        delayed update, sec. 4.3, which this model leaves out)."""
        return self.forward_s + max(self.backward_s, self.grads_down_s) + self.host_step_s + self.params_up_s


def predict_offload_step(n_params: int, pcie: str = "PCIe 4.0", lanes: int = 16, tokens: int = 0,
                         gpu: str = "A100", mfu: float = 0.4, host_GBps: float = 50.0,
                         bytes_per_value: int = 2, dp_size: int = 1) -> OffloadPrediction:
    """Predict a ZeRO-Offload step: compute 2 x n_params FLOPs per token forward and 4 x backward
    (Kaplan et al. 2020) at `mfu` of the GPU's dense 16-bit peak; gradients and parameters of this rank's
    shard (n_params / dp_size values of `bytes_per_value` each) cross the link once each way at its
    per-direction rate (`distlab.catalog`); the host's Adam step streams 16 + 16 bytes per fp32 value
    (read and write master, m, v, gradient) at `host_GBps` of memory bandwidth."""
    if n_params <= 0:
        raise ValueError(f"n_params={n_params!r} must be a positive number of parameters, e.g. 1.5e9")
    if dp_size < 1:
        raise ValueError(f"dp_size={dp_size!r} must be at least 1 (the ranks sharing the offloaded state)")
    link = catalog.lookup("pcie", pcie).link_GBps_per_direction(lanes) * 1e9
    flops = catalog.lookup("gpu", gpu).dense_16bit_tflops * 1e12 * mfu
    shard = n_params / dp_size
    compute = 2 * n_params * tokens / flops
    return OffloadPrediction(forward_s=compute, backward_s=2 * compute,
                             grads_down_s=shard * bytes_per_value / link,
                             host_step_s=shard * 32 / (host_GBps * 1e9),
                             params_up_s=shard * bytes_per_value / link)


# ---------------------------------------------------------------- activations


@dataclass
class ActivationOffload:
    """What `offload_activations` moved: tensors and bytes sent to the host."""

    tensors: int = 0
    bytes: int = 0


@contextlib.contextmanager
def offload_activations(pin_memory: bool = True) -> Iterator[ActivationOffload]:
    """Inside this block, every tensor autograd saves for the backward is copied to the host (pinned when
    on CUDA) and brought back to its device when the backward needs it. Trades PCIe traffic for device
    memory, as activation checkpointing trades recomputation for it (Ren et al. 2021 offload only the
    model states; activation offload is the same idea applied to the other large consumer)."""
    record = ActivationOffload()

    def pack(t: Tensor) -> tuple[torch.device, Tensor]:
        record.tensors += 1
        record.bytes += t.numel() * t.element_size()
        host = torch.empty(t.size(), dtype=t.dtype, pin_memory=pin_memory and t.is_cuda)
        host.copy_(t, non_blocking=t.is_cuda)
        return t.device, host

    def unpack(packed: tuple[torch.device, Tensor]) -> Tensor:
        device, host = packed
        return host.to(device, non_blocking=True)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield record
