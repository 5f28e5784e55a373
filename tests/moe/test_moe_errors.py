"""Mixture of experts (chapter 6): bad inputs on one process, expert parallelism without
torch.distributed, and the command line's usage errors. Parity on 1 to 4 ranks and on each half of 4
ranks is in test_moe.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from distlab.moe import ExpertParallelMoE, MoELayer, top_k_gating
from distlab.moe.__main__ import main, parser


def test_expert_parallelism_on_one_process_needs_no_torch_distributed():
    torch.manual_seed(0)
    ref = MoELayer(6, 12, num_experts=4, k=2, capacity_factor=1.0).double()
    ep = ExpertParallelMoE.from_reference(ref)
    assert (ep.rank, ep.world_size, ep.first_expert, ep.experts_per_rank) == (0, 1, 0, 4)
    x = torch.randn(10, 6, dtype=torch.float64)
    x_ref, x_ep = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref(x_ref).y.square().sum().backward()
    out = ep(x_ep)
    out.y.square().sum().backward()
    assert torch.allclose(out.y, ref(x).y, rtol=0, atol=1e-12)
    assert torch.allclose(x_ep.grad, x_ref.grad, rtol=0, atol=1e-12)
    assert out.comm.bytes_sent == 0  # nothing leaves a group of one


@pytest.mark.parametrize("x, message", [
    (torch.randint(0, 4, (5, 6)), r"tokens x have dtype torch.int64; a MoE layer takes floating-point "
                                  r"activations \(\.\.\., d_model=6\), not token ids"),
    (torch.randn(5, 6, dtype=torch.float64),
     r"tokens x have dtype torch.float64 but the layer's weights are torch.float32; convert one of them, "
     r"e.g. x.to\(torch.float32\)"),
    (torch.randn(5, 7), r"tokens x have shape \(5, 7\); the last dimension must be d_model=6"),
])
def test_tokens_of_the_wrong_dtype_or_width_are_refused(x, message):
    torch.manual_seed(0)
    ref = MoELayer(6, 12, num_experts=4)
    for layer in (ref, ExpertParallelMoE.from_reference(ref)):
        with pytest.raises(ValueError, match=message):
            layer(x)


def test_a_world_size_must_be_positive():
    from distlab.moe import check_moe_config

    with pytest.raises(ValueError, match=r"world_size=0 must be a positive integer"):
        check_moe_config(8, 1, 1.0, 0)


@pytest.mark.parametrize("capacity", [-1, 2.5, True])
def test_a_capacity_override_must_be_a_token_count(capacity):
    with pytest.raises(ValueError, match=rf"capacity={capacity!r} must be a non-negative integer"):
        top_k_gating(torch.randn(4, 3), 1, 1.0, capacity=capacity)


# --- the command line --------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--world-size", "3"], "num_experts=8 is not divisible by world_size=3"),
    (["--world-size", "0"], "argument --world-size: 0 must be at least 1"),
    (["--k", "9"], "k=9 is larger than num_experts=8"),
    (["--capacity-factor", "0"], "capacity_factor=0.0 must be a positive number"),
    (["--capacity-factor", "nan"], "capacity_factor=nan must be a positive number"),
    (["--tokens", "0"], "argument --tokens: 0 must be at least 1"),
    (["--d-model", "-4"], "argument --d-model: -4 must be at least 1"),
    (["--skew", "-1"], "argument --skew: -1.0 must be >= 0"),
    (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
])
def test_command_line_rejects_bad_values_with_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m distlab.moe") and message in err


def test_command_line_help_shows_every_default():
    text = parser().format_help()
    for option in ("--world-size", "--experts", "--k", "--capacity-factor", "--tokens", "--d-model", "--skew",
                   "--steps", "--dtype", "--seed", "--json"):
        assert option in text
    assert text.count("(default:") >= 10


def test_command_line_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "distlab.moe", "--world-size", "2", "--tokens", "16",
                           "--d-model", "8", "--steps", "1", "--json"], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    assert '"parity_passed_on_every_rank": true' in done.stdout
