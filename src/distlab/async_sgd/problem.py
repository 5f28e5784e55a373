"""The training problem every worker and the server share: a small MLP regressing a teacher network.

Parameters travel as one flat float32 vector (`torch.nn.utils.parameters_to_vector`), so the server
holds a single tensor and a gradient is a single payload. Worker w (1..W) at clock c trains on its shard
of global batch c: `batch_indices(n, global_batch, c, seed)[shard(global_batch, w - 1, W)]`, the
sampling of `distlab.models`. In synchronous mode the W shards of clock c together make global batch c,
so averaging the W gradients gives the full-batch gradient, which `sgd_reference` computes in one process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from distlab.models import MLP, regression_data
from distlab.reference import SGD, mse_loss, train_reference
from distlab.sharding import batch_indices, shard


@dataclass(frozen=True)
class Problem:
    """Sizes and seeds of the regression problem; `build()` makes the model and the data from them."""

    n: int = 1024
    d_in: int = 8
    hidden: int = 32
    seed: int = 0

    def build(self) -> tuple[nn.Module, Tensor, Tensor]:
        """(model, X, y): the MLP with weights from `seed`, and n points of teacher data."""
        torch.manual_seed(self.seed)
        model = MLP([self.d_in, self.hidden, 1])
        X, y = regression_data(self.n, self.d_in, 1, seed=self.seed + 1)
        return model, X, y


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one intra-op thread, then restore the count: on tensors this small, extra
    threads only add synchronisation (tens of times slower on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def flat_params(model: nn.Module) -> Tensor:
    """The model's parameters as one flat vector (a copy)."""
    return parameters_to_vector(model.parameters()).detach().clone()


def gradient(model: nn.Module, params: Tensor, X: Tensor, y: Tensor) -> tuple[Tensor, float]:
    """The flat gradient of the mean squared error at `params` on (X, y), and the loss itself."""
    vector_to_parameters(params, model.parameters())
    model.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    return parameters_to_vector(p.grad for p in model.parameters()).detach(), float(loss.detach())


def loss_at(model: nn.Module, params: Tensor, X: Tensor, y: Tensor) -> float:
    """The mean squared error of the model with flat parameters `params` on (X, y)."""
    with torch.no_grad():
        vector_to_parameters(params, model.parameters())
        return float(nn.functional.mse_loss(model(X), y))


def worker_batch(problem: Problem, worker: int, num_workers: int, clock: int,
                 global_batch: int) -> Tensor:
    """Indices of worker `worker`'s (1-based) examples for its clock `clock`."""
    idx = batch_indices(problem.n, global_batch, clock, problem.seed)
    return idx[shard(global_batch, worker - 1, num_workers)]


def sgd_reference(problem: Problem, steps: int, global_batch: int, lr: float) -> list[Tensor]:
    """Single-process SGD with the full global batch (`distlab.reference.train_reference`): the flat
    parameters after each of `steps` steps (entry 0 is the initial point). Synchronous training on any
    number of workers must match it."""
    model, X, y = problem.build()
    batches = [(X[idx], y[idx]) for idx in (batch_indices(problem.n, global_batch, step, problem.seed)
                                            for step in range(steps))]
    with one_thread():
        run = train_reference(model, batches, mse_loss, SGD(model.parameters(), lr), keep_history=True)
    return [parameters_to_vector(snapshot.values()) for snapshot in run.history]
