"""Chapter 7: mixed precision against torch.amp.GradScaler, gradient accumulation (one process and on
ranks with chapter 2's no_sync), its memory, the dtype check, and the two exercise checks."""

from __future__ import annotations

import pytest
import torch

from distlab import launch
from distlab.memory.exercises import check_loss_scale_update, check_sqrt_segments
from distlab.memory.measure.accumulation_peak import accumulation_peak
from distlab.memory.techniques import precision
from distlab.memory.techniques.accumulation import accumulate_gradients, split_batch
from distlab.memory.techniques.precision import LossScaler, MasterWeights, update_scale
from distlab.models import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=32)


def _batch(b, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(11, (b, 16), generator=g), torch.randint(11, (b, 16), generator=g)


def test_scaler_matches_grad_scaler_step_for_step_with_forced_overflows():
    run = precision.compare_with_grad_scaler(steps=12, init_scale=2.0**24, growth_interval=3)
    assert run["same_scales"] and run["same_skipped"] and run["same_params"]
    assert run["skipped"][0] and not all(run["skipped"])  # the huge start overflows, then it recovers
    assert max(run["scales"][1:]) < 2.0**24


def test_update_rule_and_static_scaler():
    assert update_scale(8.0, 5, True) == (4.0, 0)
    assert update_scale(8.0, 1, False, growth_interval=3) == (8.0, 2)
    assert update_scale(8.0, 2, False, growth_interval=3) == (16.0, 0)
    static = LossScaler(init_scale=128.0, dynamic=False)
    for found in (True, False, False):
        static.update(found)
    assert static.scale == 128.0
    with pytest.raises(ValueError, match="init_scale=0 must be positive"):
        LossScaler(init_scale=0)
    with pytest.raises(ValueError, match="growth_interval=0 must be at least 1"):
        LossScaler(growth_interval=0)


def test_master_weights_train_a_bf16_model_close_to_fp32_and_skip_overflows():
    torch.manual_seed(0)
    ref = GPT(CONFIG)
    half = GPT(CONFIG).to(torch.bfloat16)
    half.load_state_dict({k: v.to(torch.bfloat16) for k, v in ref.state_dict().items()})
    opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    mw = MasterWeights(half, lambda ps: torch.optim.Adam(ps, lr=1e-3))
    assert all(m.dtype == torch.float32 for m in mw.state_tensors())
    x, y = _batch(4)
    for _ in range(5):
        opt.zero_grad()
        ref(x, y)[1].backward()
        opt.step()
        mw.zero_grad()
        mw.backward(half(x, y)[1])
        assert not mw.step()
    for p, m in zip(ref.parameters(), mw.master, strict=True):
        assert (p - m).abs().max() < 2e-2  # bf16 compute: 8 bits of mantissa, 5 steps of lr 1e-3
    before = [m.clone() for m in mw.master]
    mw.zero_grad()
    mw.scaler = LossScaler(init_scale=2.0**200)  # the fp32 scaled loss is inf: the step must be skipped
    mw.backward(half(x, y)[1])
    assert mw.step() and mw.scaler.scale == 2.0**199
    assert all(torch.equal(a, b) for a, b in zip(before, mw.master, strict=True))
    with pytest.raises(ValueError, match="MasterWeights needs a model in float16 or bfloat16"):
        MasterWeights(ref, torch.optim.SGD)


def test_why_it_is_needed_underflow_and_accumulation():
    g = torch.tensor([1e-9, 1e-6, 1e-3, 0.0])
    assert precision.underflow_fraction(g, 1.0) == pytest.approx(1 / 3)
    assert precision.underflow_fraction(g, 2.0**16) == 0.0
    demo = precision.accumulation_demo(4096, 1.0)
    assert demo == {"fp16": 2048.0, "fp32": 4096.0, "exact": 4096.0}


def test_dtype_check_on_cpu_and_a_device_that_cannot(monkeypatch):
    precision.require_dtype(torch.float16, "cpu")  # torch 2.13 computes fp16 on CPU (in software)
    precision.require_dtype(torch.bfloat16, "cpu")
    assert precision.cuda_supports(torch.float16, (7, 0)) and not precision.cuda_supports(
        torch.float16, (5, 2)
    )
    assert not precision.cuda_supports(torch.bfloat16, (7, 5)) and precision.cuda_supports(
        torch.bfloat16, (8, 0)
    )

    def no_half(dtype, device):
        raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'\nmore")

    monkeypatch.setattr(precision, "_probe", no_half)
    with pytest.raises(ValueError, match=r"device cpu cannot train in float16 .*use dtype=torch.bfloat16"):
        precision.require_dtype(torch.float16, "cpu")


def test_accumulation_equals_the_large_batch_and_uneven_micro_batches():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    x, y = _batch(7)
    model(x, y)[1].backward()
    ref = [p.grad.clone() for p in model.parameters()]
    for micro in (1, 3, 7):  # 3 splits 7 sequences unevenly: 3 + 3 + 1
        model.zero_grad()
        accumulate_gradients(model, split_batch(x, y, micro))
        for p, r in zip(model.parameters(), ref, strict=True):
            torch.testing.assert_close(p.grad, r, rtol=1e-5, atol=1e-6)  # fp32, a different summation order
    with pytest.raises(ValueError, match="micro_batch=0 must be at least 1"):
        split_batch(x, y, 0)
    with pytest.raises(ValueError, match="micro_batches is empty"):
        accumulate_gradients(model, [])


def test_memory_falls_with_the_micro_batch():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    x, y = _batch(8)
    opt = torch.optim.Adam(model.parameters())
    accumulate_gradients(model, split_batch(x, y, 8))
    opt.step()
    peaks = [accumulation_peak(model, x, y, micro, opt) for micro in (8, 4, 2, 1)]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]


def _dp_accumulate(batch: int, micro: int, strategy: str) -> list[torch.Tensor]:
    import torch.distributed as dist

    from distlab.data_parallel import make_strategy
    from distlab.sharding import shard

    torch.manual_seed(0)
    model = GPT(CONFIG)
    x, y = _batch(batch)
    part = shard(batch, dist.get_rank(), dist.get_world_size())
    sync = make_strategy(strategy, model, bucket_bytes=1 << 14)
    accumulate_gradients(model, split_batch(x[part], y[part], micro), strategy=sync)
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(("world_size", "micro", "strategy"), [(2, 2, "overlapped"), (3, 3, "bucketed")])
def test_accumulation_with_no_sync_on_ranks_equals_the_large_batch(world_size, micro, strategy):
    batch = 4 * world_size  # each rank: 4 sequences in micro-batches of `micro` (4 = 3 + 1 is uneven)
    results = launch.run(_dp_accumulate, world_size, batch, micro, strategy)
    torch.manual_seed(0)
    model = GPT(CONFIG)
    x, y = _batch(batch)
    model(x, y)[1].backward()
    for grads in results:
        for p, g in zip(model.parameters(), grads, strict=True):
            torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6)


def test_loss_scale_exercise_passes_the_reference_and_explains_mistakes():
    assert check_loss_scale_update(update_scale)

    def grows_after_skip(scale, tracker, found_inf, growth, backoff, interval):
        return (
            (scale * growth, 0)
            if found_inf
            else update_scale(scale, tracker, False, growth, backoff, interval)
        )

    def early(scale, tracker, found_inf, growth, backoff, interval):
        return update_scale(scale, tracker, found_inf, growth, backoff, interval - 1)

    def keeps_count(scale, tracker, found_inf, growth, backoff, interval):
        return (
            (scale * backoff, tracker)
            if found_inf
            else update_scale(scale, tracker, False, growth, backoff, interval)
        )

    def fixed_two(scale, tracker, found_inf, growth, backoff, interval):
        return update_scale(scale, tracker, found_inf, 2.0, 0.5, interval)

    for fn, message in (
        (grows_after_skip, "you grew the scale after a skipped step"),
        (early, "you grew the scale too early"),
        (keeps_count, "the count of clean steps restarts at 0"),
        (fixed_two, "must grow by growth_factor=4, not by 2"),
    ):
        report = check_loss_scale_update(fn)
        assert not report and message in str(report), str(report)


def test_segments_exercise_passes_sqrt_and_explains_mistakes():
    from distlab.memory.estimate.cost_model import sqrt_segments

    assert check_sqrt_segments(sqrt_segments)
    for fn, message in (
        (lambda n: [n], "recomputes the whole model at once"),
        (lambda n: [1] * n, "every layer's input is kept"),
        (lambda n: [1] * (n - 1), "they must cover all"),
        (lambda n: [n - n // 2, n // 2] if n > 1 else [1], "aim for about sqrt"),
        (lambda n: [0, n], "positive whole numbers"),
    ):
        report = check_sqrt_segments(fn)
        assert not report and message in str(report), str(report)


def test_measured_mixed_precision_model_states_are_2_2_12_bytes_per_parameter():
    from distlab.memory.measure.accounting import gpt_loss_fn, measure_step

    torch.manual_seed(0)
    half = GPT(CONFIG).to(torch.bfloat16)
    x, y = _batch(4)
    step = measure_step(half, gpt_loss_fn(x, y), MasterWeights(half, lambda ps: torch.optim.Adam(ps)))
    n = sum(p.numel() for p in half.parameters())
    assert step.params_bytes == 2 * n and step.grads_bytes == 2 * n
    assert 12 * n <= step.optimizer_bytes <= 12 * n + 4 * 64  # plus Adam's 4-byte step per tensor
