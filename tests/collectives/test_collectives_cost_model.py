"""The alpha-beta-gamma cost model: hand-computed values, monotonicity, bounds, fitting, bad inputs.

No timing thresholds here: how fast this machine is lives in the benchmarks, not in the tests.
"""

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from distlab.collectives import cost_model as cm
from distlab.collectives import fit_machine
from distlab.collectives.cost_model import MachineParams, predict
from distlab.collectives.fit import PING_PONG_SIZES, fit_alpha_beta
from distlab.collectives.segmenting import DEFAULT, Segmenting

# Round numbers so that every expected value below can be checked by hand.
M = MachineParams(alpha=10.0, beta=1.0, gamma=0.5)
N = 12.0  # bytes
ALL_REDUCE = ("ring_all_reduce", "segmented_ring_all_reduce", "recursive_doubling_all_reduce")


@pytest.mark.parametrize(("name", "p", "expected"), [
    # ring all-reduce 2(p-1)a + 2(p-1)/p n b + (p-1)/p n g
    ("ring_all_reduce", 2, 20 + 12 + 3),
    ("ring_all_reduce", 3, 40 + 16 + 4),
    # 12 bytes are one segment: the segmented ring costs what the textbook ring costs
    ("segmented_ring_all_reduce", 3, 40 + 16 + 4),
    # ring reduce-scatter (p-1)a + (p-1)/p n (b + g); all-gather (p-1)a + (p-1)/p n b
    ("ring_reduce_scatter", 4, 30 + 9 * 1.5),
    ("ring_all_gather", 4, 30 + 9),
    # recursive doubling: floor(log2 p) (a + n b + n g), + (a + n b + n g) + (a + n b) if p is no power of 2
    ("recursive_doubling_all_reduce", 2, 28),
    ("recursive_doubling_all_reduce", 3, 28 + 28 + 22),
    ("recursive_doubling_all_reduce", 4, 56),
    ("recursive_doubling_all_reduce", 5, 56 + 28 + 22),
    ("recursive_doubling_all_reduce", 8, 84),
    # binomial trees: ceil(log2 p) rounds
    ("tree_broadcast", 5, 3 * 22),
    ("tree_reduce", 5, 3 * 28),
    ("tree_broadcast", 4, 2 * 22),
    ("tree_gather", 4, 20 + 9),
    ("tree_gather", 3, 20 + 8),
    # as implemented, scatter sends a shape header before each block: one more alpha per round
    ("tree_scatter", 4, 2 * 20 + 9),
    # pairwise all-to-all (p-1)a + (p-1)/p n b, plus (p-1)a for the size headers
    ("pairwise_all_to_all", 4, 2 * 30 + 9),
    ("pairwise_all_to_all", 3, 2 * 20 + 8),
])
def test_formulas_match_hand_computed_values(name, p, expected):
    assert predict(name, N, p, M) == pytest.approx(expected)


@pytest.mark.parametrize(("name", "p", "expected"), [
    ("tree_scatter", 4, 20 + 9),
    ("pairwise_all_to_all", 4, 30 + 9),
    ("ring_all_reduce", 3, 40 + 16 + 4),
])
def test_textbook_variants_drop_headers_and_segments(name, p, expected):
    assert predict(name, N, p, M, textbook=True) == pytest.approx(expected)


def test_ring_reduce_scatter_sends_segments_and_hides_all_reduction_but_the_last():
    mib = float(DEFAULT.segment_bytes)
    n = 8 * mib  # p = 2: one step with a chunk of 4 segments
    # 4 messages, 4 segments at max(beta, gamma) = beta, and the last segment's reduction at gamma
    assert predict("ring_reduce_scatter", n, 2, M) == pytest.approx(4 * 10 + 4 * mib + 0.5 * mib)
    assert predict("ring_reduce_scatter", n, 2, M, textbook=True) == pytest.approx(10 + 4 * mib * 1.5)
    # the all-gather sends the same 4 segments, with nothing to reduce
    assert predict("segmented_ring_all_reduce", n, 2, M) == pytest.approx(40 + 4.5 * mib + 40 + 4 * mib)
    assert predict("ring_all_reduce", n, 2, M) == pytest.approx(10 + 6 * mib + 10 + 4 * mib)
    assert predict("ring_all_reduce", n, 2, M) == predict("segmented_ring_all_reduce", n, 2, M, textbook=True)
    # when reducing is slower than sending, the transfers hide behind the reductions instead
    slow = MachineParams(alpha=10.0, beta=0.5, gamma=1.0)
    assert predict("ring_reduce_scatter", n, 2, slow) == pytest.approx(40 + 4 * mib + 0.5 * mib)


def test_the_segmenting_passed_in_reaches_the_model():
    small = Segmenting(segment_bytes=1024, pipeline_depth=2, min_segment_bytes=256)
    # p = 2, 8 KiB: one 4 KiB chunk per step, cut into 4 segments of 1 KiB
    assert cm.segments_per_chunk(4096, small) == 4
    assert predict("ring_reduce_scatter", 8192, 2, M, segmenting=small) == pytest.approx(
        4 * 10 + 4096 + 0.5 * 1024)
    assert predict("segmented_ring_all_reduce", 8192, 2, M, segmenting=small) == pytest.approx(
        4 * 10 + 4096 + 0.5 * 1024 + 4 * 10 + 4096)
    assert predict("ring_all_gather", 8192, 2, M, segmenting=small) == pytest.approx(4 * 10 + 4096)
    # a chunk of two min_segment_bytes or more is cut in two even when one segment would hold it
    assert cm.segments_per_chunk(512, small) == 2 and cm.segments_per_chunk(511, small) == 1
    assert cm.segments_per_chunk(3 << 20, DEFAULT) == 2
    # without a segmenting, the model is the textbook form
    assert cm.ring_all_reduce_time(8192, 2, M) == predict("ring_all_reduce", 8192, 2, M)
    textbook = predict("ring_reduce_scatter", 8192, 2, M, textbook=True)
    assert cm.ring_reduce_scatter_time(8192, 2, M) == textbook
    # the textbook form ignores segmenting
    assert predict("segmented_ring_all_reduce", 8192, 2, M, segmenting=small, textbook=True) == predict(
        "ring_all_reduce", 8192, 2, M)


def test_the_cost_model_imports_only_the_standard_library_and_numpy():
    allowed = {"__future__", "math", "collections.abc", "dataclasses", "numpy", "numpy.typing",
               "distlab.collectives.segmenting"}
    for name in ("cost_model.py", "segmenting.py"):
        tree = ast.parse((Path(cm.__file__).parent / name).read_text())
        imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert imported <= allowed, (name, imported - allowed)


def test_hierarchical_is_the_sum_of_its_three_phases():
    intra, inter = M, MachineParams(alpha=100.0, beta=4.0, gamma=0.5)
    # p = 4 = 2 nodes x 2 ranks: tree reduce in the node (10 + 12 + 6) + ring all-reduce of all 12 bytes
    # between the 2 leaders (100 + 6 * 4.5, then 100 + 6 * 4) + tree broadcast in the node (10 + 12)
    got = predict("hierarchical_all_reduce", N, 4, intra, ranks_per_node=2, inter=inter)
    assert got == pytest.approx(28 + 127 + 124 + 22)
    # one node: a tree reduce and a tree broadcast; one rank per node: just the inter-node ring
    assert predict("hierarchical_all_reduce", N, 4, M, ranks_per_node=4) == pytest.approx(2 * 28 + 2 * 22)
    # 6 ranks in nodes of 4: the full node (4 ranks) and 2 leaders set the time
    assert predict("hierarchical_all_reduce", N, 6, intra, ranks_per_node=4, inter=inter) == pytest.approx(
        2 * 28 + 2 * 22 + 127 + 124)
    assert predict("hierarchical_all_reduce", N, 4, intra, ranks_per_node=1, inter=inter) == pytest.approx(
        predict("segmented_ring_all_reduce", N, 4, inter))


@pytest.mark.parametrize("name", sorted(cm.COST_MODELS))
def test_one_rank_costs_nothing_and_cost_grows_with_size(name):
    extra = {"ranks_per_node": 1} if name == "hierarchical_all_reduce" else {}
    assert predict(name, 1e6, 1, M, **extra) == 0.0
    sizes = np.logspace(0, 9, 19)
    for p in (2, 3, 4, 7, 8):
        if name == "hierarchical_all_reduce":
            extra = {"ranks_per_node": 2}
        t = predict(name, sizes, p, M, **extra)
        assert isinstance(t, np.ndarray) and t.shape == sizes.shape
        assert np.all(np.diff(t) > 0), f"{name} on {p} ranks is not increasing in the message size"


@pytest.mark.parametrize("name", ["ring_all_reduce", "segmented_ring_all_reduce", "ring_reduce_scatter",
                                  "ring_all_gather",
                                  "tree_broadcast", "tree_reduce", "pairwise_all_to_all", "tree_scatter"])
def test_cost_does_not_fall_as_ranks_are_added(name):
    t = [predict(name, 1e6, p, M) for p in range(1, 17)]
    assert all(b >= a for a, b in zip(t, t[1:], strict=False)), t


def test_lower_bound_is_below_every_all_reduce_and_tight_for_the_ring_bandwidth():
    sizes = np.logspace(0, 9, 10)
    for p in range(1, 17):
        bound = cm.all_reduce_lower_bound(sizes, p, M)
        for name in ALL_REDUCE:
            assert np.all(predict(name, sizes, p, M) >= bound - 1e-9)
        if p % 2 == 0:
            assert np.all(predict("hierarchical_all_reduce", sizes, p, M, ranks_per_node=2) >= bound - 1e-9)
    # for big messages the ring attains the bandwidth bound: its busbw tends to 1/beta
    m = MachineParams(alpha=1e-5, beta=1e-9)
    n, p = 1e10, 8
    algbw = n / predict("ring_all_reduce", n, p, m, textbook=True)
    assert algbw == pytest.approx(cm.all_reduce_bandwidth_bound(p, m), rel=1e-3)
    # the segmented ring pays one alpha per segment: well under 1 % off for segments of megabytes
    algbw = n / predict("segmented_ring_all_reduce", n, p, m)
    assert algbw == pytest.approx(cm.all_reduce_bandwidth_bound(p, m), rel=0.02)
    assert cm.all_reduce_bandwidth_bound(1, m) == math.inf


def test_recursive_doubling_wins_small_messages_ring_wins_large():
    m = MachineParams(alpha=1e-5, beta=1e-9, gamma=1e-10)
    for p in (4, 8, 16):
        assert predict("recursive_doubling_all_reduce", 1e3, p, m) < predict("ring_all_reduce", 1e3, p, m)
        assert predict("recursive_doubling_all_reduce", 1e9, p, m) > predict("ring_all_reduce", 1e9, p, m)


def test_every_algorithm_has_a_cost_model():
    from distlab.collectives.algorithms import ALGORITHMS

    assert set(cm.COST_MODELS) == set(ALGORITHMS)


def test_machine_params_repr_reads_in_microseconds_and_gigabytes_per_second():
    m = MachineParams(alpha=25e-6, beta=1 / 5e9, gamma=1 / 20e9)
    assert repr(m) == "MachineParams(alpha=25 µs, beta=1/(5 GB/s), gamma=1/(20 GB/s))"
    assert m.bandwidth_GBps == pytest.approx(5.0)
    assert MachineParams(1e-6, 0.0).bandwidth_GBps == math.inf


def test_fit_recovers_alpha_and_beta_from_noisy_synthetic_data():
    rng = np.random.default_rng(0)
    alpha, beta = 30e-6, 1 / 3e9
    sizes = np.array(PING_PONG_SIZES, dtype=float)
    times = (alpha + beta * sizes) * rng.lognormal(0.0, 0.05, size=sizes.shape)  # 5 % noise
    a, b = fit_alpha_beta(sizes, times)
    assert a == pytest.approx(alpha, rel=0.1)
    assert b == pytest.approx(beta, rel=0.1)
    # ordinary least squares would have let the 64 MB point decide alpha; the relative fit does not
    ols_alpha = np.polyfit(sizes, times, 1)[1]
    assert abs(a - alpha) < abs(ols_alpha - alpha)


def test_fit_pins_a_negative_intercept_to_zero():
    sizes = np.array([1e3, 1e4, 1e5])
    a, b = fit_alpha_beta(sizes, sizes * 1e-9 - 0.5e-6)  # a line whose intercept is -0.5 µs
    assert a == 0.0 and 0 < b < 1e-9  # the 1 kB point, 2x off the line, pulls beta down


def test_fit_machine_on_two_ranks_returns_points_and_parameters():
    fit = fit_machine(sizes=(4, 4096, 1 << 18), repeats=1, gamma_bytes=1 << 20)
    assert fit.sizes.tolist() == [4, 4096, 1 << 18]
    assert fit.times.shape == fit.fitted.shape == fit.rel_error.shape == (3,)
    assert np.all(fit.times > 0) and fit.params.alpha >= 0 and fit.params.beta >= 0 and fit.params.gamma > 0
    np.testing.assert_allclose(fit.fitted, fit.params.alpha + fit.params.beta * fit.sizes)
    assert fit.rms_rel_error <= fit.max_rel_error
    assert "rms relative error" in repr(fit)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: predict("ring_allreduce", 1, 2, M), "unknown algorithm 'ring_allreduce'; choose one of"),
    (lambda: predict("ring_all_reduce", 1, 0, M), "p=0 must be a positive integer number of ranks"),
    (lambda: predict("ring_all_reduce", 1, 2.5, M), "p=2.5 must be a positive integer"),
    (lambda: predict("ring_all_reduce", -1, 2, M), "nbytes=-1 must be sizes in bytes >= 0"),
    (lambda: predict("hierarchical_all_reduce", 1, 4, M), "needs ranks_per_node=..."),
    (lambda: predict("hierarchical_all_reduce", 1, 6, M, ranks_per_node=0),
     "ranks_per_node=0 must be a positive integer number of ranks"),
    (lambda: predict("ring_all_reduce", 1, 4, M, ranks_per_node=2),
     "apply only to 'hierarchical_all_reduce'"),
    (lambda: MachineParams(alpha=-1.0, beta=1e-9), "MachineParams.alpha=-1.0 must be a finite number >= 0"),
    (lambda: fit_alpha_beta([1.0], [1.0]), "for at least two sizes"),
    (lambda: fit_alpha_beta([1.0, 2.0], [1.0, 0.0]), "times > 0 seconds"),
    (lambda: fit_machine(sizes=(0, 4)), "sizes=(0, 4) must hold at least two sizes >= 1 byte"),
    (lambda: predict("ring_all_reduce", 1, 2, M, segmenting=4096), "segmenting=4096 must be a Segmenting"),
])
def test_bad_input_names_the_value_and_the_fix(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


def test_the_ring_formulas_on_one_number_equal_the_vectorised_ones_exactly():
    """The fast path on one float (the planner's) is the same formula: equal to the bit, for ints, floats
    and numpy floats, and it refuses what the array path refuses."""
    machine = MachineParams(alpha=3.1e-6, beta=1 / 23.7e9, gamma=1 / 91e9)
    sizes = [0, 1, 7, 4096, 3.3e5, 1 << 30, 8.123456789e11]
    for f in (cm.ring_all_reduce_time, cm.ring_reduce_scatter_time, cm.ring_all_gather_time):
        for p in (1, 2, 3, 8, 1024):
            vector = f(np.array(sizes, dtype=np.float64), p, machine)
            for n, want in zip(sizes, vector, strict=True):
                for one in (n, float(n), np.float64(n)):
                    got = f(one, p, machine)
                    assert type(got) is float and got == want, (f.__name__, n, p, got, want)
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="nbytes=.* must be sizes in bytes >= 0"):
            cm.ring_all_reduce_time(bad, 4, machine)
    with pytest.raises(ValueError, match="p=0 must be a positive integer"):
        cm.ring_all_reduce_time(1e6, 0, machine)
