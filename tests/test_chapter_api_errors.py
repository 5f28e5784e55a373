"""Bad input to the chapters' public functions that used to be accepted, or refused naming the wrong
thing (found by a probe of the chapter APIs): each is now a ValueError that names the parameter, its
value and the fix. Pure Python, no ranks."""

from __future__ import annotations

import math

import pytest
import torch

from distlab.async_sgd.parameter_server import PSConfig, validate
from distlab.context_parallel.layouts import chunk_ids, pad_to_multiple
from distlab.memory.estimate.estimator import MemoryConfig, estimate
from distlab.models import GPTConfig
from distlab.moe.expert_parallel import ExpertParallelMoE
from distlab.moe.layer import MoELayer
from distlab.parallel3d.config import Plan3D, check_plan
from distlab.pipeline.partition import balanced_boundaries
from distlab.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear


@pytest.mark.parametrize(("make", "message"), [
    (lambda: GPTConfig(vocab_size=8, n_layer=True), r"n_layer=True must be a positive integer"),
    (lambda: GPTConfig(vocab_size=8, n_embd=False), r"n_embd=False must be a positive integer"),
    (lambda: ColumnParallelLinear(0, 4), r"column.in_features=0 must be a positive integer"),
    (lambda: ColumnParallelLinear(4, 0), r"column.out_features=0 must be a positive integer"),
    (lambda: RowParallelLinear(0, 4), r"row.in_features=0 must be a positive integer"),
    (lambda: RowParallelLinear(4, -1), r"row.out_features=-1 must be a positive integer"),
    (lambda: MoELayer(d_model=0, d_hidden=8, num_experts=2), r"d_model=0 must be a positive integer"),
    (lambda: MoELayer(d_model=4, d_hidden=0, num_experts=2), r"d_hidden=0 must be a positive integer"),
    (lambda: ExpertParallelMoE(d_model=0, d_hidden=8, num_experts=2), r"d_model=0 must be a positive"),
    (lambda: balanced_boundaries([1.0, -2.0, 1.0], 2), r"costs\[1\]=-2.0 must be a finite number >= 0"),
    (lambda: balanced_boundaries([1.0, math.nan, 1.0], 2), r"costs\[1\]=nan must be a finite number"),
    (lambda: balanced_boundaries([1.0, math.inf], 2), r"costs\[1\]=inf must be a finite number"),
    (lambda: chunk_ids(0, 0, "zigzag"), r"p=0 must be a positive number of ranks"),
    (lambda: estimate(MemoryConfig(params=1e9, zero=5)), r"^zero=5 is not a ZeRO stage"),
    (lambda: estimate(MemoryConfig(params=1e9, zero=True)), r"^zero=True is not a ZeRO stage"),
    (lambda: validate(PSConfig(timeout=math.inf), 3), r"timeout=inf must be a finite number of seconds"),
    (lambda: validate(PSConfig(timeout=math.nan), 3), r"timeout=nan must be a finite number of seconds"),
    (lambda: validate(PSConfig(worker_timeout=math.inf), 3), r"worker_timeout=inf must be a finite"),
    (lambda: validate(PSConfig(worker_timeout=math.nan), 3), r"worker_timeout=nan must be a finite"),
])
def test_bad_values_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(("batch", "seq", "message"), [
    (0, 12, r"batch=0 must be a positive integer \(the global batch's sequences\)"),
    (8, 0, r"seq=0 must be a positive integer \(the global batch's tokens per sequence\)"),
    (-8, 12, r"batch=-8 must be a positive integer"),
])
def test_check_plan_refuses_an_empty_batch(batch, seq, message):
    config = GPTConfig(vocab_size=24, block_size=12, n_layer=4, n_head=12, n_embd=24)
    with pytest.raises(ValueError, match=message):
        check_plan(Plan3D(), config, batch, seq)


def test_padding_targets_with_the_ignore_index():
    y = pad_to_multiple(torch.tensor([[1, 2, 3]]), 2, "zigzag", dim=1, value=-100)
    assert y.tolist() == [[1, 2, 3, -100]]
