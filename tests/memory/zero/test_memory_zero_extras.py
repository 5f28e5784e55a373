"""Chapter 7's extras around ZeRO: the exercise check, offload (transfer model, activation offload, host
memory), and memory-efficient optimizers and compression (Adafactor, PowerSGD).

The exercise check is run once, on every attempt below together (`check_zero2_hooks`: one start of 4
ranks); the compression comparison once, on 2 ranks.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.distributed as dist

from distlab import catalog, launch
from distlab.dist_compat import reduce_scatter_single
from distlab.memory.techniques import compression
from distlab.memory.zero import exercises as zero_exercises
from distlab.memory.zero import offload
from distlab.memory.zero.parity import GLOBAL_BATCH, SEED, zero_task

# ---------------------------------------------------------------- the exercise check


def _padded(g: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros(math.ceil(g.numel() / n) * n)
    out[:g.numel()] = g
    return out


def not_averaged(g, group):
    n = dist.get_world_size(group)
    p = _padded(g, n)
    out = torch.empty(p.numel() // n)
    reduce_scatter_single(out, p, group=group)
    return out


def all_reduced(g, group):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    p = _padded(g, n)
    dist.all_reduce(p, group=group)
    return (p / n).view(n, -1)[r]


def whole(g, group):
    dist.all_reduce(g, group=group)
    return g / dist.get_world_size(group)


def not_padded(g, group):
    n = dist.get_world_size(group)
    k = g.numel() // n
    out = torch.empty(k)
    reduce_scatter_single(out, g[:k * n].contiguous(), group=group)
    return out / n


def global_rank(g, group):
    n = dist.get_world_size(group)
    p = _padded(g, n)
    dist.all_reduce(p, group=group)
    s = p.numel() // n
    return (p / n)[dist.get_rank() * s:(dist.get_rank() + 1) * s]


def no_communication(g, group):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return _padded(g, n).view(n, -1)[r]


def raises(g, group):
    raise RuntimeError("not written yet")


ATTEMPTS = [zero_exercises.zero2_reduce_scatter, not_averaged, all_reduced, whole, not_padded, global_rank,
            no_communication, raises]


@functools.cache
def _reports() -> dict[str, str]:
    results = zero_exercises.check_zero2_hooks(ATTEMPTS)
    return {fn.__name__: (bool(r), str(r)) for fn, r in zip(ATTEMPTS, results, strict=True)}


def test_the_reference_solution_passes_every_group() -> None:
    ok, text = _reports()["zero2_reduce_scatter"]
    assert ok, text
    assert "PASSED (5 of 5 passed)" in text
    assert "N=3 on global ranks {1,2,3}" in text and "N=1 on global ranks {0}" in text


@pytest.mark.parametrize("name, message", [
    ("not_averaged", "the shard is the sum over the 2 ranks, not the average: divide by the group size N=2"),
    ("all_reduced", "the values are right, but an all-reduce sends 2 (N-1)/N of the gradient per rank"),
    ("whole", "returned 10 values, the whole gradient: return only this rank's shard of 5"),
    ("not_padded", "returned 3 values but the shard has 4: 10 is not divisible by N=3, so pad the gradient"),
    ("global_rank", "the shard of group-rank 0 has ceil(10/2) = 5 (was it cut with the global rank? use "
                    "dist.get_rank(group))"),
    ("no_communication", "the values are this rank's own gradient: reduce over the group"),
    ("raises", "raised RuntimeError: not written yet"),
])
def test_wrong_attempts_are_explained(name: str, message: str) -> None:
    ok, text = _reports()[name]
    assert not ok
    assert message in text, text


# ---------------------------------------------------------------- offload


def test_transfer_model_reads_the_pcie_catalog() -> None:
    link = catalog.lookup("pcie", "PCIe 4.0").link_GBps_per_direction(16) * 1e9
    p = offload.predict_offload_step(1_000_000_000, "PCIe 4.0")
    assert p.grads_down_s == p.params_up_s == 2e9 / link
    assert p.forward_s == p.backward_s == 0.0
    assert p.step_s == p.grads_down_s + p.host_step_s + p.params_up_s
    faster = offload.predict_offload_step(1_000_000_000, "PCIe 5.0")
    assert faster.grads_down_s == pytest.approx(p.grads_down_s / 2)
    sharded = offload.predict_offload_step(1_000_000_000, "PCIe 4.0", dp_size=4)
    assert sharded.grads_down_s == pytest.approx(p.grads_down_s / 4)
    busy = offload.predict_offload_step(1_000_000_000, tokens=1_000_000)  # backward hides the copy
    assert busy.backward_s > busy.grads_down_s
    assert busy.step_s == pytest.approx(busy.forward_s + busy.backward_s + busy.host_step_s
                                        + busy.params_up_s)
    with pytest.raises(ValueError, match="unknown pcie 'PCIe 9'"):
        offload.predict_offload_step(10, "PCIe 9")
    with pytest.raises(ValueError, match="n_params=0 must be a positive number of parameters"):
        offload.predict_offload_step(0)


def test_host_room_error_names_the_bytes() -> None:
    with pytest.raises(MemoryError, match=r"needs 2,000 bytes of host memory .* only 1,999 bytes are "):
        offload.check_host_room(2000, available=lambda: 1999)
    offload.check_host_room(2000, available=2000)
    assert offload.available_host_bytes() > 0


def test_activation_offload_gives_the_same_gradients() -> None:
    task = zero_task("mlp")
    x, y = task.batch(0, GLOBAL_BATCH, SEED)
    grads = []
    for use in (False, True):
        model = task.build(SEED)
        if use:
            with offload.offload_activations() as record:
                loss = task.loss(model, x, y)
        else:
            loss = task.loss(model, x, y)
        loss.backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    assert record.tensors > 0 and record.bytes >= 4 * x.numel()


# ---------------------------------------------------------------- Adafactor and PowerSGD


def test_adafactor_state_is_factored() -> None:
    task = compression.compression_task()
    for name, formula in (("adam", compression.adam_state_bytes),
                          ("adafactor", compression.adafactor_state_bytes)):
        model = task.build(SEED)
        opt = compression.OPTIMIZERS[name](model.parameters(), lr=1e-2)
        task.loss(model, *task.batch(0, GLOBAL_BATCH, SEED)).backward()
        opt.step()
        assert compression.state_bytes(opt) == formula(model), name
    model = task.build(SEED)
    assert compression.adam_state_bytes(model) == 8 * 5508 + 4 * 6
    assert compression.adafactor_state_bytes(model) == 4 * (80 + 64 + 128 + 64 + 68 + 4) + 4 * 6
    adam, ada = compression.train_curve("adam"), compression.train_curve("adafactor")  # 60 steps
    assert adam[-1] < adam[0] / 4 and ada[-1] < ada[0] / 4
    with pytest.raises(ValueError, match="optimizer='sgd' is unknown; choose one of adam, adafactor"):
        compression.train_curve("sgd")


def test_powersgd_sends_fewer_bytes_and_still_learns() -> None:
    results = {r.method: r for r in launch.run(compression.compare_compression, 2, steps=30)[0]}
    assert results["allreduce"].sent_bytes_per_step == 4 * 5508  # N = 2: the ring sends B once
    # rank 2: P and Q of 64x16 (160 values), 64x64 (256), 4x64 (136), and the 132 biases as they are
    assert results["ours"].sent_bytes_per_step == 4 * (160 + 256 + 136 + 132)
    assert results["pytorch"].sent_bytes_per_step < results["allreduce"].sent_bytes_per_step / 4
    first = compression.compression_task()
    start = first.loss(first.build(SEED), *first.batch(0, GLOBAL_BATCH, SEED)).item()
    for r in results.values():
        assert r.final_loss < start / 4, r


def test_bench_command_line_validates_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    from distlab.memory import bench

    with pytest.raises(SystemExit) as e:
        bench.main(["--world-size", "0"])
    assert e.value.code == 2
    assert "argument --world-size: 0 must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    assert "ranks to start (default: 2)" in capsys.readouterr().out
    assert bench.speed_ratios({"zero3": 1.0, "fsdp2": 2.0}) == {"zero3 / fsdp2": 2.0}
