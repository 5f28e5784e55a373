"""ZeRO stages 0-3 (distlab.memory.zero) against plain data parallelism, PyTorch's own, and the paper.

One launch per world size 1..4 (cached by `_ranks(n)`): every rank trains the MLP task (174 parameters in
units of 104 and 70, so shards are uneven and padded on 3 and 4 ranks) with each stage, and returns the
losses, final parameters, bytes held and bytes sent; on 2 ranks also the GPT task (tied embeddings, a
root unit) with each stage and with PyTorch's ZeroRedundancyOptimizer and FSDP2, and the bad inputs; on
4 ranks also every stage over the dp dim of grid(dp=2, tp=2).

The bytes sent are counted by `distlab.comm_log` opened around the last step (`accounting.zero_sent_bytes`,
without ZeRO's control messages).

Tolerance (zero_parity.TOLERANCE, atol = rtol = 1e-5): the averaged gradient is the single process's sum
in another order, a few 2**-24 relative apart; Adam's update is scale-free, so parameters after 4 steps
at lr 1e-2 agree to ~1e-7 (measured: 3e-8 on the MLP, 3e-7 on the GPT). A real bug moves them by ~lr.
Memory and communication are integers and are compared exactly.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from distlab import launch, mesh
from distlab.comm_log import ring_bytes
from distlab.memory import bench
from distlab.memory.zero import parity as zero_parity
from distlab.memory.zero.accounting import (
    FP32,
    MIXED,
    comm_ratio_to_dp,
    comm_sent_bytes,
    model_state_bytes,
)
from distlab.memory.zero.engine import ZeRO, check_stage, dp_group

STAGES = (0, 1, 2, 3)


def _message(kind: type[Exception], fn) -> str:
    try:
        fn()
    except kind as e:
        return str(e)
    return "no error"


def _bad_inputs() -> dict[str, str]:
    """Inside the ranks of a 2-rank world: the messages of every bad input."""
    model = zero_parity.zero_task("mlp").build(zero_parity.SEED)
    other = zero_parity.zero_task("mlp").build(zero_parity.SEED)
    half = dist.new_group([0])  # collective over the world: every rank makes it
    m = mesh.grid(dp=2)
    out = {
        "stage": _message(ValueError, lambda: ZeRO(model, 4)),
        "stage_bool": _message(ValueError, lambda: check_stage(True)),
        "units": _message(ValueError, lambda: ZeRO(model, 3, units=[other[0]])),
        "axis": _message(ValueError, lambda: dp_group(m, "ep")),
        "room": _message(MemoryError, lambda: ZeRO(model, 1, offload=True, host_bytes_available=1000)),
    }
    if dist.get_rank() == 1:
        out["member"] = _message(ValueError, lambda: ZeRO(model, 1, group=half))
    return out


def _on_ranks() -> dict:
    n = dist.get_world_size()
    out: dict = {"mlp": {s: zero_parity.train_zero(s, "mlp") for s in STAGES}}
    if n == 2:
        out["gpt"] = {s: zero_parity.train_zero(s, "gpt") for s in STAGES}
        task = zero_parity.zero_task("gpt")
        out["builtin"] = {k: bench.train_builtin(k, task).losses for k in ("zero_redundancy", "fsdp2")}
        out["offload"] = {s: zero_parity.train_zero(s, "mlp", offload=True) for s in STAGES}
        out["no_prefetch"] = zero_parity.train_zero(3, "gpt", prefetch=False)
        out["errors"] = _bad_inputs()
    if n == 4:
        dp = mesh.grid(dp=2, tp=2)["dp"].get_group()
        out["sub"] = {s: zero_parity.train_zero(s, "mlp", group=dp) for s in STAGES}
    return out


@functools.cache
def _ranks(n: int) -> list[dict]:
    return launch.run(_on_ranks, n, timeout=120.0)


@functools.cache
def _reference(task: str) -> zero_parity.RunResult:
    return zero_parity.train_reference(task)


def _assert_agree(a: zero_parity.RunResult, b: zero_parity.RunResult) -> None:
    assert a.params.keys() == b.params.keys()
    torch.testing.assert_close(torch.tensor(a.losses), torch.tensor(b.losses), **zero_parity.TOLERANCE)
    for name in a.params:
        torch.testing.assert_close(a.params[name], b.params[name], **zero_parity.TOLERANCE, msg=name)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_stage_matches_one_process_adam(n: int) -> None:
    ref = _reference("mlp")
    for rank_result in _ranks(n):
        for stage in STAGES:
            _assert_agree(rank_result["mlp"][stage], ref)
    for stage in STAGES:  # every rank ends with bitwise the same model
        first = _ranks(n)[0]["mlp"][stage].params
        assert all(torch.equal(r["mlp"][stage].params[k], first[k]) for r in _ranks(n) for k in first)


def test_gpt_with_tied_embeddings_and_builtins() -> None:
    ref = _reference("gpt")
    results = _ranks(2)[0]
    for stage in STAGES:
        _assert_agree(results["gpt"][stage], ref)
    _assert_agree(results["no_prefetch"], ref)
    for kind, losses in results["builtin"].items():  # PyTorch's ZeRO-1 and FSDP2 on the same task
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref.losses), **zero_parity.TOLERANCE,
                                   msg=kind)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(results["gpt"][1].losses),
                                   **zero_parity.TOLERANCE, msg=kind)


def test_offload_equals_the_device_run() -> None:
    for r in _ranks(2):
        for stage in STAGES:
            off, on = r["offload"][stage], r["mlp"][stage]
            assert off.losses == on.losses  # the same ops on the same values: bitwise
            assert all(torch.equal(off.params[k], on.params[k]) for k in on.params)
            padded = off.padded_psi
            shard = padded if stage == 0 else padded // 2
            assert off.memory["host"] == 16 * shard  # master 4 + Adam 8 + gradient landing buffer 4
            assert off.memory["optimizer"] == 0  # nothing of Adam's on the device


def test_sub_group_of_a_mesh_equals_the_whole_world_run() -> None:
    whole = _ranks(2)[0]["mlp"]
    for r in _ranks(4):
        for stage in STAGES:
            sub = r["sub"][stage]
            assert sub.losses == whole[stage].losses
            assert all(torch.equal(sub.params[k], whole[stage].params[k]) for k in sub.params)
            assert sub.sent_bytes == whole[stage].sent_bytes


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_bytes_held_per_rank_are_the_papers_formula_in_fp32(n: int) -> None:
    for r in _ranks(n):
        for stage in STAGES:
            run = r["mlp"][stage]
            assert run.padded_psi % n == 0 and run.padded_psi - 174 < 2 * n  # <= n-1 padding per unit
            predicted = model_state_bytes(run.padded_psi, n, stage, **FP32)
            measured = {k: v for k, v in run.memory.items() if k != "host"}
            assert measured == {k: int(v) for k, v in predicted.items()}, (n, stage)


def test_mixed_precision_formula_reproduces_the_papers_figure_1() -> None:
    # Psi = 7.5 B parameters, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device.
    gb = [model_state_bytes(7_500_000_000, 64, s, **MIXED)["total"] / 1e9 for s in STAGES]
    assert gb == [120.0, 31.40625, 16.640625, 1.875]
    assert model_state_bytes(100, 4, 2) == {"parameters": 200.0, "gradients": 50.0, "optimizer": 300.0,
                                            "total": 550.0}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_bytes_sent_per_step_are_2_psi_and_3_psi(n: int) -> None:
    run = {s: _ranks(n)[0]["mlp"][s] for s in STAGES}
    psi_bytes = 4 * run[0].padded_psi
    dp = 2 * (n - 1) * psi_bytes // n  # the ring all-reduce: (N - 1)/N of the buffer, twice
    assert run[0].sent_bytes == {"all_reduce": dp, "reduce_scatter": 0, "all_gather": 0, "total": dp}
    for stage in (1, 2):
        one_pass = (n - 1) * psi_bytes // n
        assert run[stage].sent_bytes == {"all_reduce": 0, "reduce_scatter": one_pass,
                                         "all_gather": one_pass, "total": dp}
    assert run[3].sent_bytes["all_gather"] == 2 * run[3].sent_bytes["reduce_scatter"]
    for stage in STAGES:
        assert run[stage].sent_bytes["total"] == comm_sent_bytes(run[stage].padded_psi, n, stage)
        if n > 1:
            ratio = run[stage].sent_bytes["total"] / dp
            assert ratio == comm_ratio_to_dp(stage) == (1.5 if stage == 3 else 1)


def test_ring_byte_counts() -> None:
    # the ring factors ZeRO's counts use are the ground floor's (distlab.comm_log.ring_bytes)
    assert ring_bytes("all_reduce", 1200, 4) == 1800
    assert ring_bytes("reduce_scatter", 1200, 4) == ring_bytes("all_gather", 1200, 4) == 900
    assert ring_bytes("all_gather", 1200, 1) == 0
    with pytest.raises(ValueError, match="psi=10 is not a multiple of n=4; pass the padded count"):
        comm_sent_bytes(10, 4, 1)


def test_bad_inputs_have_clear_messages() -> None:
    errors = _ranks(2)[1]["errors"]
    assert "stage=4 is not a ZeRO stage; choose 0 (plain data parallelism), 1 (shard the optimizer" in \
        errors["stage"]
    assert "stage=True is not a ZeRO stage" in errors["stage_bool"]
    assert "units ['Linear'] are not modules of the model; pass submodules of it" in errors["units"]
    assert "dp_group(axis='ep'): the mesh has no axis 'ep'; its axes are ['dp']; build the mesh with " \
        "distlab.mesh.grid(ep=..., ...)" in errors["axis"]
    assert "group=[0] (global ranks) does not contain this rank (1); pass the data-parallel group" in \
        errors["member"]
    assert errors["room"].startswith("offload=True needs 1,392 bytes of host memory on this rank")
    assert "but only 1,000 bytes are available; shard the state over more ranks" in errors["room"]
    with pytest.raises(ValueError, match=r"stage=-1 is not a ZeRO stage"):
        check_stage(-1)
    with pytest.raises(ValueError, match=r"stage=4 is not a ZeRO stage; choose 0, 1, 2 or 3"):
        model_state_bytes(10, 2, 4)


def test_zero_outside_ranks_says_how_to_start_them() -> None:
    model = zero_parity.zero_task("mlp").build(zero_parity.SEED)
    with pytest.raises(RuntimeError, match=r"ZeRO needs a process group, and none is initialised"):
        ZeRO(model, 1)
