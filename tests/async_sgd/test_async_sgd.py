"""Chapter 3: the parameter server (sync parity with single-process SGD on 1 to 3 workers, invariants of
the asynchronous modes under any interleaving, a worker that dies), Hogwild! against serial SGD, the
schedule simulation, the delayed-SGD stability bound, bad input and the exercise check.

Launches are the expensive part (a few seconds each on 2 cores): each test starts as few as it can.
No test depends on timing; a hang would be ended by the launcher's timeout.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from distlab import launch, mesh
from distlab.async_sgd import hogwild as H
from distlab.async_sgd import parity
from distlab.async_sgd.__main__ import main
from distlab.async_sgd.cost_model import async_seconds, max_stable_lr, sync_seconds, version_staleness_bound
from distlab.async_sgd.exercises import check_may_start
from distlab.async_sgd.messages import HEADER_LEN, Kind, header
from distlab.async_sgd.parameter_server import PSConfig, WorkerLog, run_rank, validate
from distlab.async_sgd.problem import Problem, sgd_reference
from distlab.async_sgd.runs import Run, loss_curve, train
from distlab.async_sgd.server import ServerLog
from distlab.async_sgd.simulate import Deadlock, simulate
from distlab.async_sgd.ssp import may_start
from distlab.async_sgd.staleness import delayed_sgd, spectral_radius


def applied_exactly_once(run: Run) -> None:
    """Every push a worker sent was applied once, and nothing else was applied."""
    sent = sorted((log.worker, c) for log in run.workers if isinstance(log, WorkerLog) for c, _ in log.pushes)
    sent = sorted(sent + [(d.worker, c) for d in run.server.deaths for c in range(d.clock)])  # dead: no log
    applied = sorted((u.worker, u.clock) for u in run.server.updates)
    assert applied == sent
    assert len(set(applied)) == len(applied)
    read = {(log.worker, c): v for log in run.workers if isinstance(log, WorkerLog) for c, v in log.pushes}
    assert all(u.read_version == read.get((u.worker, u.clock), u.read_version) for u in run.server.updates)


# --- synchronous mode = single-process SGD with the same global batch ------------------------------

@pytest.mark.parametrize("workers", [1, 2, 3])
def test_sync_mode_equals_single_process_sgd(workers):
    steps, lr = 6, 0.05
    run = train(PSConfig(mode="sync", steps=steps, lr=lr, global_batch=48), workers)
    ref = sgd_reference(Problem(), steps, 48, lr)
    # float32: the server averages W shard means where the reference takes one mean over the whole batch,
    # so sums run in a different order; over 6 steps that moves parameters by a few ulps (~1e-7 relative).
    assert [v for v, _, _ in run.server.snapshots] == list(range(steps + 1))
    for (v, _, p), want in zip(run.server.snapshots, ref, strict=True):
        torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-6, msg=f"parameters after step {v}")
    # and so each step's update (-lr x the averaged gradient) matches the full-batch gradient step
    for t in range(steps):
        torch.testing.assert_close(run.server.snapshots[t + 1][2] - run.server.snapshots[t][2],
                                   ref[t + 1] - ref[t], rtol=1e-4, atol=1e-6)
    assert all(u.staleness == 0 and u.clock_gap == 0 for u in run.server.updates)
    assert len(run.server.updates) == steps * workers
    applied_exactly_once(run)
    assert parity.sync_parity(run.server, ref, f"{workers} worker(s)").verdict() == (
        f"{workers} worker(s): all 7 snapshots and staleness agree with single-process SGD within 1e-05: ok")
    late = ServerLog(run.server.config, workers, run.server.updates[:1], run.server.snapshots[:1])
    with pytest.raises(AssertionError, match=r"recorded versions \[0\], expected 0 to 6"):
        parity.sync_parity(late, ref, "x")
    off = [(v, t, p + 1e-3 * (v == 3)) for v, t, p in run.server.snapshots]
    report = parity.sync_parity(ServerLog(run.server.config, workers, run.server.updates, off), ref, "x")
    assert report.failures() == ["snapshots[3]"]
    with pytest.raises(AssertionError, match=r"x: max \|diff\| 1.00e-03 at snapshots\[3\]"):
        report.assert_passed()
    with pytest.raises(ValueError, match=r"the reference has 1 entries, the initial point and no step"):
        parity.sync_parity(run.server, ref[:1], "x")


def _on_each_half() -> dict:
    """Inside 4 ranks: a synchronous PS job on each group of the tp dim of grid(dp=2, tp=2) ({0, 1} and
    {2, 3}), then on each group of the dp dim ({0, 2} and {1, 3}: the second job's server is global rank 1).
    A rank outside a group is refused."""
    grid = mesh.grid(dp=2, tp=2)
    config = PSConfig(mode="sync", steps=4, lr=0.05, global_batch=48)
    out = {}
    for dim in ("tp", "dp"):
        group = grid[dim].get_group()
        log = run_rank(config, group)
        out[dim] = {"group": dist.get_process_group_ranks(group), "position": dist.get_rank(group),
                    "server": isinstance(log, ServerLog),
                    "snapshots": [p for _, _, p in log.snapshots] if isinstance(log, ServerLog) else None}
    first_two = dist.new_group([0, 1])  # collective over the world; ranks 2 and 3 are not members
    try:
        run_rank(config, first_two)
        out["not a member"] = "no error"
    except ValueError as e:
        out["not a member"] = str(e)
    return out


def test_a_ps_job_on_each_half_of_the_world_equals_single_process_sgd():
    ranks = launch.run(_on_each_half, 4, backend="gloo", timeout=60)
    ref = sgd_reference(Problem(), 4, 48, 0.05)
    for dim, halves in (("tp", [[0, 1], [2, 3]]), ("dp", [[0, 2], [1, 3]])):
        servers = [r for r, found in enumerate(ranks) if found[dim]["server"]]
        assert servers == [halves[0][0], halves[1][0]], dim  # position 0 of each group serves
        for r in servers:
            found = ranks[r][dim]
            assert found["group"] in halves and found["position"] == 0
            for got, want in zip(found["snapshots"], ref, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"{dim} job of rank {r}")
    for r, found in enumerate(ranks):
        if r >= 2:
            assert f"global rank {r}) is not a member of the process group" in found["not a member"]


# --- asynchronous modes: what holds under any interleaving ----------------------------------------

def test_async_mode_applies_every_push_once_and_learns():
    config = PSConfig(mode="async", steps=8, compute_time=0.005, straggler=1, slowdown=3)
    run = train(config, 3)
    applied_exactly_once(run)
    assert len(run.server.updates) == 8 * 3  # the budget exactly: none in flight at the end is extra
    assert [u.applied_version for u in run.server.updates] == list(range(len(run.server.updates)))
    assert all(u.staleness == u.applied_version - u.read_version >= 0 for u in run.server.updates)
    _, _, loss = loss_curve(run)
    assert loss[-1] < 0.5 * loss[0]


def test_ssp_bounds_the_clock_gap_and_the_staleness():
    s = 1
    run = train(PSConfig(mode="ssp", staleness=s, steps=8, compute_time=0.005, straggler=1, slowdown=4), 3)
    applied_exactly_once(run)
    assert max(u.clock_gap for u in run.server.updates) <= s
    assert max(u.staleness for u in run.server.updates) <= version_staleness_bound(3, s) == 6


# --- a worker that dies --------------------------------------------------------------------------

@pytest.mark.parametrize("mode, staleness", [("async", math.inf), ("ssp", 1)])
def test_async_server_carries_on_without_a_dead_worker_and_reports_it(mode, staleness):
    config = PSConfig(mode=mode, staleness=staleness, steps=6, compute_time=0.005, fail_worker=2, fail_at=2)
    run = train(config, 3)
    assert isinstance(run.workers[1], launch.RankError)
    assert "worker 2 crashed at clock 2" in str(run.workers[1])
    [death] = run.server.deaths
    assert death.worker == 2 and death.clock == 2  # its pushes for clocks 0 and 1 arrived
    assert death.version <= run.server.version
    applied_exactly_once(run)
    assert len(run.server.updates) == 6 * 3  # the others made up the budget, and no more


def test_sync_mode_fails_clearly_when_a_worker_dies():
    config = PSConfig(mode="sync", steps=6, fail_worker=1, fail_at=3)
    with pytest.raises(launch.RankError, match=r"synchronous mode: worker 1 lost its connection .* at "
                                               r"version 3, .*needs a gradient from every worker"):
        train(config, 2)


# --- the command line, under torchrun ------------------------------------------------------------

def test_python_m_async_sgd_runs_under_torchrun():
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "3", "-m", "distlab.async_sgd",
                          "--mode", "ssp", "--staleness", "1", "--steps", "4"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mode=ssp workers=2: 8 gradients applied" in out.stdout  # --steps 4 x 2 workers, no more
    assert "staleness histogram: 0: " in out.stdout


def test_the_command_applies_steps_times_workers_gradients(capsys):
    """`python -m distlab.async_sgd --steps 10` with 2 workers applied 21 gradients (issue 38, D13): a
    worker sent parameters just before the budget was reached pushed one more. Now exactly 20."""
    main(["--steps", "10", "--world-size", "3"])
    out = capsys.readouterr().out
    assert "mode=async workers=2: 20 gradients applied, final version 20," in out, out


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("config, world_size, message", [
    (PSConfig(), 1, r"world_size=1: a parameter server needs at least 2 ranks"),
    (PSConfig(mode="hogwild"), 3, r"mode='hogwild' is unknown; choose one of sync, ssp, async"),
    (PSConfig(mode="ssp", staleness=-1), 3, r"staleness=-1 must be a whole number of clock ticks >= 0"),
    (PSConfig(mode="ssp", staleness=1.5), 3, r"staleness=1.5 must be a whole number"),
    (PSConfig(straggler=3), 3, r"straggler=3 is not a worker: with world_size=3 the workers are ranks 1..2"),
    (PSConfig(straggler=0), 3, r"straggler=0 is not a worker"),
    (PSConfig(fail_worker=5), 4, r"fail_worker=5 is not a worker"),
    (PSConfig(slowdown=0.5), 3, r"slowdown=0.5 must be >= 1"),
    (PSConfig(global_batch=10), 4, r"global_batch=10: .*divisible by the 3 workers; use a multiple of 3"),
    (PSConfig(compute_time=1.0, worker_timeout=0.5), 3, r"worker_timeout=0.5 s is not longer than"),
    (PSConfig(timeout=1.0), 3, r"timeout=1.0 s must be longer than worker_timeout=2.0 s"),
    # settings that used to run without an error and do something else than asked
    (PSConfig(mode="ssp"), 3, r"mode='ssp' with staleness=inf is fully asynchronous"),
    (PSConfig(mode="async", staleness=2), 3, r"staleness=2 applies only to mode='ssp', and mode='async'"),
    (PSConfig(lr=math.nan), 3, r"lr=nan must be a finite positive number"),
    (PSConfig(lr=0.0), 3, r"lr=0.0 must be a finite positive number"),
    (PSConfig(global_batch=0), 3, r"global_batch=0: steps must be >= 1 and the global batch at most"),
    (PSConfig(global_batch=2048), 3, r"global_batch=2048: .* at most the 1024 examples"),
    (PSConfig(steps=0), 3, r"steps=0, global_batch=48: steps must be >= 1"),
    (PSConfig(fail_worker=1, fail_at=20), 3, r"fail_at=20 must be a clock from 0 to steps - 1 = 19"),
    (PSConfig(record_every=0), 3, r"record_every=0 must be a positive integer"),
    (PSConfig(compute_time=math.nan), 3, r"compute_time=nan must be a number of seconds >= 0"),
])
def test_bad_settings_are_named(config, world_size, message):
    with pytest.raises(ValueError, match=message):
        validate(config, world_size)


def test_command_line_bad_values_get_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--world-size" in out and "--workers" not in out and "(default: 4)" in out
    assert "the server (rank 0)" in out
    for argv, message in ((["--world-size", "1"], "world_size=1: a parameter server needs at least 2 ranks"),
                          (["--mode", "ssp"], "--mode ssp needs --staleness S"),
                          (["--staleness", "2"], "staleness=2 applies only to mode='ssp'"),
                          (["--lr", "nan"], "lr=nan must be a finite positive number"),
                          (["--straggler", "4"], "straggler=4 is not a worker: with world_size=4"),
                          (["--steps", "x"], "argument --steps: 'x' is not a whole number")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: python -m distlab.async_sgd") and message in err, err


def test_train_checks_before_starting_ranks():
    with pytest.raises(ValueError, match=r"world_size=1: a parameter server needs at least 2 ranks"):
        train(PSConfig(), 0)


def test_header_framing():
    h = header(Kind.PUSH, 3, 17, 321)
    assert h.dtype == torch.int64 and h.tolist() == [int(Kind.PUSH), 3, 17, 321] and HEADER_LEN == 4


# --- the rule and the simulation -----------------------------------------------------------------

def test_may_start_is_ssp():
    assert may_start(3, [3, 3], 0) and not may_start(4, [3, 4], 0)
    assert may_start(5, [3, 5], 2) and not may_start(6, [3, 6], 2)
    assert may_start(100, [0, 100], math.inf)


@pytest.mark.parametrize("times", [(4.0, 1.0, 1.0), (1.0, 2.0, 3.0, 5.0), (1.0,)])
def test_simulation_keeps_the_ssp_guarantees(times):
    W = len(times)
    for mode, s in (("sync", 0), ("ssp", 0), ("ssp", 1), ("ssp", 3), ("async", math.inf)):
        steps = simulate(mode, times, 10, s)
        assert len(steps) >= 10 * W
        assert len({(st.worker, st.clock) for st in steps}) == len(steps)
        bound = 0 if mode == "sync" else version_staleness_bound(W, s)
        assert max(st.staleness for st in steps) <= bound, (mode, s)
    sync_end = max(st.end for st in simulate("sync", times, 10))
    async_end = max(st.end for st in simulate("async", times, 10))
    assert async_end <= sync_end  # nobody waits for the straggler


def test_simulation_names_a_deadlock():
    with pytest.raises(Deadlock, match=r"workers \[1, 2\] wait with clocks \[0, 0\] and none is computing"):
        simulate("sync", (1.0, 1.0), 3, rule=lambda c, clocks, s: c - min(clocks) < s)
    with pytest.raises(ValueError, match="mode='bulk' is unknown"):
        simulate("bulk", (1.0,), 3)


def test_closed_forms_match_the_simulation_and_refuse_bad_input():
    times = [0.04, 0.01, 0.01]
    assert sync_seconds(times, 30) == pytest.approx(max(st.end for st in simulate("sync", times, 30)))
    assert async_seconds(times, 30) == pytest.approx(0.4)
    assert async_seconds(times, 30) <= max(st.end for st in simulate("async", times, 30))
    assert version_staleness_bound(1, math.inf) == 0 and version_staleness_bound(4, 2) == 15
    with pytest.raises(ValueError, match=r"step_times=\[0.01, 0\] must hold one positive time per worker"):
        sync_seconds([0.01, 0], 3)
    with pytest.raises(ValueError, match=r"steps=0 must be a positive integer"):
        async_seconds([0.01], 0)
    with pytest.raises(ValueError, match=r"staleness=-1 must be a whole number"):
        version_staleness_bound(3, -1)
    with pytest.raises(ValueError, match=r"h=0.0 must be a positive curvature"):
        max_stable_lr(0.0, 2)
    with pytest.raises(ValueError, match=r"steps=10, lr=nan: steps must be a positive integer"):
        delayed_sgd(Problem(), 2, math.nan, 10)


# --- the cost of staleness -----------------------------------------------------------------------

@pytest.mark.parametrize("tau", [0, 1, 2, 3, 5, 8])
def test_max_stable_lr_is_the_stability_boundary(tau):
    lr = max_stable_lr(2.0, tau)
    assert spectral_radius(2.0, 0.98 * lr, tau) < 1 < spectral_radius(2.0, 1.02 * lr, tau)
    assert max_stable_lr(1.0, tau) <= (2.0 if tau == 0 else math.pi / (2 * tau))


# --- Hogwild! ------------------------------------------------------------------------------------

def test_hogwild_and_locked_sgd_converge_like_serial_sgd():
    data = H.sparse_classification_data(n=4000, dim=500, nnz=5, seed=1)
    serial, _ = H.serial_sgd(data, 2, 0.5)
    free = H.hogwild(data, 2, epochs=2, lr=0.5)
    locked = H.hogwild(data, 2, epochs=2, lr=0.5, locked=True)
    assert free.updates == locked.updates == 2 * 4000
    for result in (free, locked):
        assert result.losses[0] == pytest.approx(math.log(2))
        assert result.losses[-1] < 0.8 * result.losses[0]
        # not bit-equal (the order of updates differs, and Hogwild's races), but the same convergence
        assert abs(result.losses[-1] - serial[-1]) < 0.03


def test_sparse_data_has_distinct_features_per_example():
    data = H.sparse_classification_data(n=3000, dim=50, nnz=8, seed=2)
    assert all(len(set(row)) == 8 for row in data.idx.tolist())
    assert set(np.unique(data.y)) == {-1.0, 1.0}
    with pytest.raises(ValueError, match="nnz=0 must be between 1 and dim=50"):
        H.sparse_classification_data(n=10, dim=50, nnz=0)
    with pytest.raises(ValueError, match=r"epochs=0 must be a positive integer: with no epoch"):
        H.serial_sgd(data, 0, 0.5)
    with pytest.raises(ValueError, match=r"lr=nan must be a finite positive number"):
        H.hogwild(data, 2, epochs=1, lr=math.nan)


# --- the exercise check --------------------------------------------------------------------------

def test_exercise_check_passes_the_rule_and_explains_mistakes():
    assert check_may_start(may_start)
    strict = check_may_start(lambda c, clocks, s: c - min(clocks) < s)
    assert not strict and "compare with <=, not <" in str(strict) and "deadlocks" in str(strict)
    fastest = check_may_start(lambda c, clocks, s: max(clocks) - c <= s)
    assert "compare with the minimum clock, not the maximum" in str(fastest)
    always = check_may_start(lambda c, clocks, s: True)
    assert "let it start when a worker at clock" in str(always)
    with pytest.raises(ValueError, match="fn=3 is not a function"):
        check_may_start(3)
