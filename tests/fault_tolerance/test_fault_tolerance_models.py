"""Chapter 11's closed forms without ranks: HSDP's bytes and time on a cluster, goodput under failures."""

from __future__ import annotations

import numpy as np
import pytest

from distlab.fault_tolerance import cost_model, goodput


def test_hsdp_bytes_inside_and_across_follow_the_ring_factors() -> None:
    psi, b = 1e9, 2.0
    got = cost_model.per_rank_bytes(psi, replicate=4, shard=8, b=b)
    assert got["inside"] == pytest.approx(3 * 7 / 8 * psi * b)
    assert got["across"] == pytest.approx(2 * 3 / 4 * psi * b / 8)
    zero3 = cost_model.per_rank_bytes(psi, replicate=1, shard=32, b=b)
    assert zero3["across"] == 0 and zero3["inside"] == pytest.approx(3 * 31 / 32 * psi * b)
    assert cost_model.model_state_bytes(psi, 4, 8) == pytest.approx(16 * psi / 8)


def test_padding_is_counted_as_chapter_7_lays_it_out() -> None:
    # rows 11 on 4 ranks: 3 rows each, 12 in all; a 0-d parameter is one row on each rank
    assert cost_model.unit_bytes([(11, 6), (11,)], shard=4) == 4 * (3 * 6 + 3) * 4
    assert cost_model.unit_bytes([()], shard=2) == 2 * 1 * 4


def test_on_a_cluster_hsdp_sends_less_across_and_holds_more() -> None:
    one, two = cost_model.compare_on_cluster("DGX H100", [1, 2], psi=7e9)
    assert one["hsdp_s"] == pytest.approx(one["zero3_s"]) and one["hsdp_GB"] == one["zero3_GB"]
    assert two["hsdp_s"] < two["zero3_s"] < two["zero3_flat_s"]
    assert two["hsdp_GB"] == pytest.approx(2 * two["zero3_GB"])


def test_daly_wall_time_is_least_at_dalys_interval() -> None:
    # Daly 2006, fig. 3: M = 24 h, R = 10 min, delta = 5 min; the model's optimum is 117 min
    m, delta, restart = 24 * 60.0, 5.0, 10.0
    taus = np.linspace(60, 200, 1401)
    walls = [goodput.daly_wall_time(500 * 60.0, t, delta, restart, m) for t in taus]
    assert taus[int(np.argmin(walls))] == pytest.approx(117, abs=1.0)
    assert goodput.checkpoint_goodput(m, 1.0, delta, restart)["interval"] == pytest.approx(116.7, abs=0.1)


def test_healing_beats_restart_when_failures_are_frequent() -> None:
    m = goodput.mtbf_from_rate(24.0)  # one failure an hour
    ckpt = goodput.checkpoint_goodput(m, step_s=2.0, delta=60.0, restart=300.0)
    heal = goodput.healing_goodput(m, step_s=2.0, detect=1.0, heal=5.0, replicas=8, replace=300.0)
    assert heal["fraction"] > ckpt["fraction"] > 0
    assert heal["lost_per_failure"] == pytest.approx(1.0 + 2.0 + 305.0 / 8)
    assert heal["steps_per_hour"] == pytest.approx(heal["fraction"] * 1800)


def test_goodput_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match=r"replicas=1 must be an integer >= 2: one replica has no live peer"):
        goodput.healing_goodput(3600.0, 1.0, 1.0, 1.0, replicas=1)
    with pytest.raises(ValueError, match=r"mtbf=0 must be a positive number of seconds"):
        goodput.checkpoint_goodput(0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"restart=-1 must be a number of seconds, 0 or more"):
        goodput.daly_wall_time(1.0, 1.0, 1.0, -1, 10.0)
    with pytest.raises(ValueError, match=r"failures_per_day=0 must be a positive number"):
        goodput.mtbf_from_rate(0)
    with pytest.raises(ValueError, match=r"shard=0 must be a positive integer"):
        cost_model.per_rank_bytes(1e9, 2, 0)


def test_the_exercise_check_passes_the_formula_and_reports_a_stub() -> None:
    from distlab.fault_tolerance.exercises import check_healing_fraction

    def right(mtbf, step_s, detect, heal, replicas, replace):  # type: ignore[no-untyped-def]
        return max(0.0, 1.0 - (detect + step_s + (replace + heal) / replicas) / mtbf)

    def stub(*args):  # type: ignore[no-untyped-def]
        raise NotImplementedError("Your turn")

    assert check_healing_fraction(right).passed
    wrong = check_healing_fraction(lambda m, t, d, h, r, rr: 1.0 - (d + t + rr + h) / m)
    assert not wrong.passed and "(t_r + t_h) / R" in str(wrong)
    assert check_healing_fraction(stub).not_written


def test_a_quorum_below_min_replicas_raises_a_clear_error_in_time() -> None:
    # One replica of three is alive and min_replicas=2: the two silent ones are found dead after the
    # heartbeat timeout, the quorum of one is refused, and the error says how to fix it; no ranks needed.
    import datetime
    import time

    import torch.distributed as dist

    from distlab.fault_tolerance.quorum import QuorumClient, QuorumError

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=10))
    beat = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=datetime.timedelta(seconds=10))
    client = QuorumClient(master, beat, replica=0, replicas=3, min_replicas=2, heartbeat_interval=0.02,
                          heartbeat_timeout=0.1, join_timeout=0.5)
    start = time.monotonic()
    try:
        with pytest.raises(QuorumError, match=r"only replicas \[0\] are alive, fewer than min_replicas=2"):
            client.quorum(0, 0, expected=(0, 1, 2))
    finally:
        client.close()
    assert time.monotonic() - start < 5
