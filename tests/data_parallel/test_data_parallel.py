"""Data parallelism (distlab.data_parallel) against a single process and against PyTorch's DDP.

Every world size 1..4 gets ONE launch (a launch costs seconds on two cores), cached by `_ranks(p)`: each
rank trains the MLP with every strategy, with DDP, and with gradient accumulation, computes one step's
averaged gradients, tries the bad inputs, and returns it all; the tests below assert on pieces of it.

Tolerance. The data-parallel gradient is the same sum as the single-process one, of the same float32
terms, added in a different order (per rank first, then across ranks by the all-reduce). float32 has a
relative rounding error of 2**-24 ~ 6e-8 per addition, so the gradients of a 24-example batch agree to a
few 1e-7 relative, and after 4 SGD steps (lr 0.05, momentum 0.9) the parameters, of size ~0.1-1, agree
to ~1e-7 absolute. We allow atol=1e-6, rtol=1e-5: ten times that, and far below any real bug (a missing
division by p, one rank's data dropped), which moves parameters by 1e-3 or more. Every rank must end with
*bitwise* the same parameters: the all-reduce hands every rank the same sums.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from matplotlib.figure import Figure
from torch.utils.checkpoint import checkpoint

from distlab import launch, mesh, models, reference, sharding
from distlab.collectives.cost_model import MachineParams
from distlab.data_parallel import (
    bench,
    buckets,
    cost_model,
    exercises,
    figures,
    parity,
    sync,
    timeline,
    train,
)
from distlab.data_parallel.__main__ import main
from distlab.data_parallel.buckets import all_reduce_bucket, copy_back

STEPS, BATCH = 4, 24  # 24 is divisible by 1, 2, 3 and 4
TOL = {"atol": 1e-6, "rtol": 1e-5}
STRATEGIES = ["per_parameter", "bucketed", "overlapped", "ddp"]
BUCKET = 4096  # small buckets: the MLP's 5.6 K parameters fall into several


def _grads_one_step(task: reference.Task, strategy: str) -> dict[str, torch.Tensor]:
    """Inside a rank: the averaged gradients of step 0, with `strategy`."""
    p, r = dist.get_world_size(), dist.get_rank()
    model = task.build(0)
    s = sync.make_strategy(strategy, model, BUCKET)
    idx = sharding.batch_indices(len(task), BATCH, 0, 0)[sharding.shard(BATCH, r, p)]
    task.loss(model, task.inputs[idx], task.targets[idx]).backward()
    s.finish()
    s.close()
    return {n: q.grad.clone() for n, q in model.named_parameters()}


def _error(fn, *args, **kwargs) -> str:
    try:
        fn(*args, **kwargs)
    except ValueError as e:
        return str(e)
    return "no error"


def _error_of(kind: type[Exception], fn) -> str:
    try:
        fn()
    except kind as e:
        return str(e)
    return "no error"


def _work(with_gpt: bool, with_exercise: bool) -> dict:
    """Everything one rank does for the tests of one world size (see the module docstring)."""
    p, r = dist.get_world_size(), dist.get_rank()
    mlp = reference.mlp_task()
    out: dict = {"params": {}, "grads": {}}
    for s in STRATEGIES:
        out["params"][s] = train.train_data_parallel(mlp, s, STEPS, BATCH, bucket_bytes=BUCKET)
    for s in ("overlapped", "ddp"):
        out["params"][f"{s}+accumulate"] = train.train_data_parallel(
            mlp, s, STEPS, BATCH, accumulation_steps=2, bucket_bytes=BUCKET)
    for s in sync.STRATEGIES:
        out["grads"][s] = _grads_one_step(mlp, s)
    if with_gpt:
        gpt = reference.gpt_task()
        for s in ("overlapped", "ddp"):
            out["params"][f"gpt:{s}"] = train.train_data_parallel(gpt, s, 2, BATCH, lr=0.1,
                                                                  bucket_bytes=BUCKET)
    # bad input: a batch the ranks cannot share evenly, replicas that differ at the start
    out["uneven"] = _error(train.train_data_parallel, mlp, "overlapped", 1, 2 * p + 1)
    torch.manual_seed(r)
    out["differ"] = _error(train.train_data_parallel, mlp, "bucketed", 1, BATCH, broadcast=False,
                           model=mlp.make_model())
    torch.manual_seed(r)
    out["differ_fixed"] = _error(train.train_data_parallel, mlp, "bucketed", 1, BATCH, broadcast=True,
                                 model=mlp.make_model())
    if with_exercise:
        out["seed 1"] = train.train_data_parallel(mlp, "overlapped", STEPS, BATCH, seed=1,
                                                  bucket_bytes=BUCKET)
        out["unfrozen"] = {s: _unfrozen_after_building(mlp, s) for s in sync.STRATEGIES}
        out["frozen"] = _error(sync.make_strategy, "bucketed", mlp.build(0).requires_grad_(False))
        world = dist.get_world_size()
        model = mlp.build(0)
        s = sync.make_strategy("overlapped", model, BUCKET)
        x, y = mlp.inputs[:4], mlp.targets[:4]
        with s.no_sync():
            mlp.loss(model, x, y).backward()
            s.finish()
        launched = len(s.works)
        mlp.loss(model, x, y).backward()  # outside no_sync: every bucket is launched during backward
        out["no_sync"] = {"launched in no_sync": launched, "launched in backward": len(s.works),
                          "buckets": len(s.buckets)}
        s.finish()

        def no_average(bucket):
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            dist.all_reduce(flat)
            copy_back(bucket, flat)

        def no_copy_back(bucket):
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            dist.all_reduce(flat)
            flat /= world

        def reversed_copy(bucket):
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            dist.all_reduce(flat)
            copy_back(bucket[::-1], flat / world)

        def broadcast_rank0(bucket):
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            dist.broadcast(flat, 0)
            copy_back(bucket, flat)

        out["exercise"] = {f.__name__: exercises.run_in_rank(f) for f in (
            lambda b: all_reduce_bucket(b), no_average, no_copy_back, reversed_copy, broadcast_rank0)}
        results = bench.measure(["bucketed", "overlapped", "ddp", "compute"], per_rank_batch=4, steps=1,
                                rounds=1, bucket_bytes=BUCKET, task=reference.mlp_task((8, 64, 64, 8)))
        out["bench"] = results
        # a parameter whose gradient is accumulated twice in one backward (reentrant checkpointing around
        # a layer also used outside it) must stop the overlapped strategy, not launch a partial bucket;
        # last in this launch, since it leaves the bucket launched by the first accumulation in flight
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 4)
        s = sync.make_strategy("overlapped", lin, BUCKET)
        x = torch.randn(2, 4, requires_grad=True)
        out["twice"] = _error_of(RuntimeError,
                                 lambda: lin(checkpoint(lin, x, use_reentrant=True)).sum().backward())
    return out


def _unfrozen_after_building(task: reference.Task, strategy: str) -> str:
    """A layer unfrozen after the strategy was built has no bucket: finish() must refuse, not skip it."""
    model = task.build(0)
    model[0].weight.requires_grad_(False)
    s = sync.make_strategy(strategy, model, BUCKET)
    model[0].weight.requires_grad_(True)
    task.loss(model, task.inputs[:4], task.targets[:4]).backward()
    message = _error(s.finish)
    s.close()
    return message


@functools.cache
def _ranks(p: int) -> list[dict]:
    return launch.run(_work, p, p == 3, p == 2, timeout=60)


@functools.cache
def _reference(task_name: str, steps: int) -> dict[str, torch.Tensor]:
    task = reference.gpt_task() if task_name == "gpt" else reference.mlp_task()
    return train.train_single_process(task, steps, BATCH, lr=0.1 if task_name == "gpt" else 0.05)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_every_strategy_matches_one_process_and_ddp(p: int) -> None:
    ranks = _ranks(p)
    ref = _reference("mlp", STEPS)
    for name, params in ranks[0]["params"].items():
        if name.startswith("gpt:"):
            continue
        for n in ref:
            torch.testing.assert_close(params[n], ref[n], **TOL, msg=lambda m, s=name, n=n: f"{s} {n}: {m}")
            torch.testing.assert_close(params[n], ranks[0]["params"]["ddp"][n], **TOL)
    for other in ranks[1:]:  # bitwise identical replicas
        for name, params in other["params"].items():
            assert all(torch.equal(params[n], ranks[0]["params"][name][n]) for n in params), name


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_averaged_gradients_equal_whole_batch_gradient(p: int) -> None:
    task = reference.mlp_task()
    model = task.build(0)
    idx = sharding.batch_indices(len(task), BATCH, 0, 0)
    task.loss(model, task.inputs[idx], task.targets[idx]).backward()
    for rank in _ranks(p):
        for strategy, grads in rank["grads"].items():
            for n, q in model.named_parameters():
                torch.testing.assert_close(grads[n], q.grad, **TOL, msg=lambda m, s=strategy: f"{s}: {m}")


def test_gpt_matches_one_process_and_ddp_on_3_ranks() -> None:
    ref = _reference("gpt", 2)
    for rank in _ranks(3):
        for s in ("overlapped", "ddp"):
            for n in ref:
                torch.testing.assert_close(rank["params"][f"gpt:{s}"][n], ref[n], **TOL)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_bad_inputs_raise_clear_errors_on_every_rank(p: int) -> None:
    for r, rank in enumerate(_ranks(p)):
        assert f"global_batch={2 * p + 1} is not divisible by world_size={p}" in rank["uneven"]
        assert "parameter '0.weight' differs between ranks" in rank["differ"], rank["differ"]
        assert "broadcast_parameters" in rank["differ"] and "torch.manual_seed" in rank["differ"]
        assert rank["differ_fixed"] == "no error", f"rank {r}: broadcasting should have fixed it"


def test_check_batch_and_bucket_bytes_messages() -> None:
    assert train.check_batch(24, 4, 3) == 2
    with pytest.raises(ValueError, match=r"global_batch=10 is not divisible by world_size=4.*multiple of 4"):
        train.check_batch(10, 4)
    with pytest.raises(ValueError, match=r"per-rank batch 6 .* accumulation_steps=4.*multiple of 8"):
        train.check_batch(12, 2, 4)
    with pytest.raises(ValueError, match=r"global_batch=0 must be a positive integer"):
        train.check_batch(0, 2)
    for bad in (0, -5, 1.5):
        with pytest.raises(ValueError, match=rf"bucket_bytes={bad!r} must be a positive number of bytes"):
            buckets.make_buckets([torch.nn.Parameter(torch.zeros(3))], bad)
    with pytest.raises(ValueError, match=r"strategy='ring' is unknown; choose one of per_parameter"):
        sync.make_strategy("ring", torch.nn.Linear(2, 2))


def test_buckets_follow_reverse_registration_order_and_cap() -> None:
    model = models.MLP([16, 64, 64, 4])  # weights 4 KiB, 16 KiB, 1 KiB; biases 256, 256, 16 B
    params = list(model.parameters())
    cut = buckets.make_buckets(params, 4096)
    assert [q for b in cut for q in b] == params[::-1]  # every parameter once, last layer first
    assert all(sum(q.numel() * 4 for q in b) <= 4096 or len(b) == 1 for b in cut)
    assert [len(b) for b in cut] == [3, 1, 1, 1]  # [b2 w2 b1], [w1], [b0], [w0]: b0 + w0 > 4 KiB
    assert len(buckets.make_buckets(params, 1)) == len(params)  # tiny cap: per-parameter
    assert len(buckets.make_buckets(params, 1 << 30)) == 1
    model[2].double()  # the middle Linear; a bucket is one flat buffer of one dtype: a dtype change closes it
    assert [len(b) for b in buckets.make_buckets(list(model.parameters()), 1 << 30)] == [2, 2, 2]


def test_no_sync_launches_nothing_and_a_synced_backward_launches_every_bucket() -> None:
    # (the "+accumulate" runs above, k = 2 micro-batches with the first under no_sync, already matched
    # one step on the whole batch)
    for rank in _ranks(2):
        found = rank["no_sync"]
        assert found["launched in no_sync"] == 0 and found["launched in backward"] == found["buckets"] == 4


def test_overlapped_refuses_a_gradient_accumulated_twice_in_one_backward() -> None:
    # Using a parameter twice is fine (autograd sums the uses before the hook; the GPT's tied embedding
    # passes the parity test above); accumulating it twice is not, and must fail loudly on every rank.
    for rank in _ranks(2):
        assert "was accumulated twice before finish()" in rank["twice"], rank["twice"]
        assert "use_reentrant=False" in rank["twice"] and "no_sync()" in rank["twice"]


def test_exercise_check_diagnoses_typical_mistakes() -> None:
    found = _ranks(2)[0]["exercise"]
    assert found["<lambda>"] == []
    assert "sums, not the averages" in found["no_average"][0]
    assert "p.grad is unchanged" in found["no_copy_back"][0]
    assert "wrong places" in found["reversed_copy"][0]
    assert "rank 0's gradient" in found["broadcast_rank0"][0]


def test_explain_names_reduce_and_missing_parameters_without_ranks() -> None:
    before = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 4.0, 5.0])]
    want = torch.tensor([2.0, 3.0, 4.0])
    assert exercises.explain([want, want], before, [2, 1]) == []
    assert "dist.reduce" in exercises.explain([want, before[1]], before, [2, 1])[0]
    half = torch.tensor([2.0, 3.0, 5.0])
    assert "parameters [1] of the bucket's 2 are wrong" in exercises.explain([half, half], before, [2, 1])[0]
    assert "all-reduce is missing" in exercises.explain([before[0] / 2, before[1] / 2], before, [2, 1])[0]


def test_check_bucketed_all_reduce_reports_the_student_stub() -> None:
    def stub(bucket):  # what `make student` leaves in the lab
        raise NotImplementedError("Your turn: write this part (see the instructions above)")

    result = exercises.check_bucketed_all_reduce(stub, world_sizes=(2,))
    assert not result and "not written yet (it raises NotImplementedError)" in str(result)
    with pytest.raises(ValueError, match="is not a function"):
        exercises.check_bucketed_all_reduce(42)


def test_measured_timelines_order_events() -> None:
    results = {r.strategy: r for r in _ranks(2)[0]["bench"]}
    assert set(results) == {"bucketed", "overlapped", "ddp", "compute"}
    for name in ("bucketed", "overlapped"):
        t = results[name].timeline
        assert t is not None and len(t.launch) == 3  # the MLP's three buckets of at most 4 KiB
        assert all(a <= b for a, b in zip(t.launch, t.done, strict=True))
        assert 0.0 <= t.hidden_fraction <= 1.0
    assert results["bucketed"].timeline.launch[0] >= results["bucketed"].timeline.backward_end
    assert results["overlapped"].timeline.launch[0] < results["overlapped"].timeline.backward_end
    assert all(r.samples_per_second > 0 for r in results.values())
    assert set(bench.ratio_to_ddp(list(results.values()))) == {2}


def test_timeline_arithmetic_and_prediction() -> None:
    t = timeline.StepTimeline("x", backward_end=1.0, step_start=2.5, launch=(0.5, 0.8, 2.0),
                              done=(0.9, 1.5, 2.5), nbytes=(1, 1, 1))
    assert t.intervals() == [(0.5, 1.5), (2.0, 2.5)]
    assert t.comm_seconds == pytest.approx(1.5) and t.hidden_seconds == pytest.approx(0.5)
    assert t.exposed_seconds == pytest.approx(1.5)
    m = MachineParams(alpha=1e-5, beta=1e-9)
    sizes = [4000, 4000, 4000, 4000]
    seq = cost_model.predicted_timeline(sizes, 0.01, 8000, 4, m, overlap=False)
    ovl = cost_model.predicted_timeline(sizes, 0.01, 8000, 4, m, overlap=True)
    one = 2 * 3 * 1e-5 + 2 * 3 / 4 * 8000 * 1e-9  # ring all-reduce of one 8000-byte bucket on 4 ranks
    assert seq.launch == pytest.approx((0.01, 0.01 + one)) and seq.step_start == pytest.approx(0.01 + 2 * one)
    assert ovl.launch[0] == pytest.approx(0.005) and ovl.step_start < seq.step_start
    assert cost_model.predict_step_seconds(1, 0.02, 10**6, m) == pytest.approx(0.02)
    assert cost_model.predict_step_seconds(4, 0.02, 10**6, m, cores=2) > 0.04


def test_figures_draw() -> None:
    for make in (figures.book_timeline_figure, figures.book_bucket_figure, figures.book_scaling_figure):
        fig = make()
        assert isinstance(fig, Figure) and fig.axes[0].get_title()


def test_bad_settings_are_refused_before_any_rank_starts() -> None:
    # each of these would "agree" with the reference, or train something else, without an error
    mlp = reference.mlp_task()
    for fn in (train.train_data_parallel, train.train_single_process):
        with pytest.raises(ValueError, match=r"steps=0 must be a positive integer: with no step"):
            fn(mlp, steps=0)
        for lr in (math.nan, math.inf, 0.0, -0.1):
            with pytest.raises(ValueError, match=rf"lr={lr!r} must be a finite positive number"):
                fn(mlp, lr=lr)
        with pytest.raises(ValueError, match=r"global_batch=481 is larger than the 480 examples"):
            fn(mlp, global_batch=481)
    with pytest.raises(ValueError, match=r"strategy='ring' is unknown; choose one of per_parameter, "
                                         r"bucketed, overlapped, ddp"):
        train.train_data_parallel(mlp, "ring")
    with pytest.raises(ValueError, match=r"has 3 inputs and 2 targets; give it the same number of each"):
        reference.Task("x", mlp.make_model, mlp.inputs[:3], mlp.targets[:2], mlp.loss)
    with pytest.raises(ValueError, match=r"strategies \['ring'\] must be one or more of per_parameter"):
        bench.check_settings(["ring"], 2, 5, 5, 4096)
    with pytest.raises(ValueError, match=r"rounds=0 must be a positive integer"):
        bench.check_settings(["ddp"], 2, 5, 0, 4096)


def test_a_strategy_refuses_parameters_it_does_not_cover() -> None:
    for r, rank in enumerate(_ranks(2)):
        for strategy, message in rank["unfrozen"].items():
            assert "1 parameter(s) of shape [(64, 16)] were frozen when the" in message, (r, strategy)
            assert "Build the strategy after the model is final" in message
        assert "has no parameter with requires_grad=True" in rank["frozen"]


def _on_mesh() -> dict:
    """Inside 4 ranks: DP over each axis of grid(dp=2, tp=2), the benchmark over dp, a foreign group."""
    mlp, dims, out = reference.mlp_task(), {"dp": 2, "tp": 2}, {}
    for s in ("per_parameter", "bucketed", "overlapped", "ddp"):
        out["dp", s] = parity.train_on_mesh_dim(mlp, dims, "dp", seeds={0: 0, 1: 1}, strategy=s, steps=STEPS,
                                                global_batch=BATCH, bucket_bytes=BUCKET)
    out["dp", "overlapped+accumulate"] = parity.train_on_mesh_dim(
        mlp, dims, "dp", seeds={0: 0, 1: 1}, strategy="overlapped", steps=STEPS, global_batch=BATCH,
        accumulation_steps=2, bucket_bytes=BUCKET)
    out["tp", "overlapped"] = parity.train_on_mesh_dim(mlp, dims, "tp", strategy="overlapped", steps=STEPS,
                                                       global_batch=BATCH, bucket_bytes=BUCKET)
    dp = mesh.grid(**dims)["dp"].get_group()
    out["bench"] = bench.measure(["overlapped", "ddp"], per_rank_batch=4, steps=1, rounds=1,
                                 bucket_bytes=BUCKET, task=reference.mlp_task((8, 64, 64, 8)), group=dp)
    first_two = dist.new_group([0, 1])  # collective over the world; ranks 2 and 3 are not members
    out["not a member"] = _error(sync.make_strategy, "overlapped", mlp.build(0), group=first_two)
    return out


def test_data_parallel_on_one_dim_of_a_mesh_equals_the_whole_world_run() -> None:
    ranks = launch.run(_on_mesh, 4, timeout=60)
    world = _ranks(2)[0]
    ref = {seed: train.train_single_process(reference.mlp_task(), STEPS, BATCH, seed=seed) for seed in (0, 1)}
    for r, rank in enumerate(ranks):
        for (dim, strategy), found in ((k, v) for k, v in rank.items() if isinstance(k, tuple)):
            seed = found["seed"]
            assert found["group"] == ([[0, 2], [1, 3]] if dim == "dp" else [[0, 1], [2, 3]])[found["job"]]
            assert seed == (found["job"] if dim == "dp" else 0)  # the two dp jobs train on different seeds
            whole = world["params"]["overlapped"] if seed == 0 else world["seed 1"]
            for n in ref[seed]:
                msg = f"rank {r}, {dim} {strategy}, {n}"
                torch.testing.assert_close(found["params"][n], ref[seed][n], **TOL, msg=msg)
                torch.testing.assert_close(found["params"][n], whole[n], **TOL, msg=msg)
        partner = ranks[r ^ 2]  # the other rank of the same dp job: bitwise the same replica
        assert all(torch.equal(rank["dp", "bucketed"]["params"][n], partner["dp", "bucketed"]["params"][n])
                   for n in ref[0])
        results = {res.strategy: res for res in rank["bench"]}  # the benchmark on a DP group of 2
        assert set(results) == {"overlapped", "ddp"} and all(res.world_size == 2 for res in results.values())
        assert len(results["overlapped"].timeline.launch) == 3
        if r >= 2:
            assert f"global rank {r}) is not a member of the process group" in rank["not a member"]
        else:
            assert rank["not a member"] == "no error"


def test_compare_gives_a_verdict_or_names_the_parameter() -> None:
    ref = train.train_single_process(reference.mlp_task(), 1, BATCH)
    verdict = parity.parameters_parity(ref, ref, "p = 2").verdict()
    assert verdict == "p = 2: all 6 parameters agree with one process within 1e-05: ok"
    off = {n: t + (1e-3 if n == "2.bias" else 0.0) for n, t in ref.items()}
    with pytest.raises(AssertionError, match=r"max \|diff\| 1.00e-03 at parameters\[2.bias\] \(tol"):
        parity.parameters_parity(off, ref, "p = 2").assert_passed()
    nan = {n: t * math.nan for n, t in ref.items()}
    with pytest.raises(AssertionError, match=r"max \|diff\| nan at parameters"):
        parity.parameters_parity(nan, ref, "p = 2").assert_passed()


def test_command_line_help_shows_defaults_and_bad_values_get_usage_errors(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "(default: [1, 2])" in capsys.readouterr().out
    for argv, message in ((["--world-size", "0"], "argument --world-size: 0 must be at least 1"),
                          (["--batch", "two"], "argument --batch: 'two' is not a whole number"),
                          (["--world-size", "100"], "--world-size 100 starts that many processes"),
                          (["--strategies", "ring"], "argument --strategies: invalid choice: 'ring'")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: python -m distlab.data_parallel") and message in err, err


def test_python_m_data_parallel_is_the_entry_point() -> None:
    out = subprocess.run([sys.executable, "-m", "distlab.data_parallel", "--rounds", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "argument --rounds: 0 must be at least 1" in out.stderr, out.stderr
