"""The nccl-tests-style benchmark: well-formed rows, busbw factors, tables and bad input.

No timing thresholds: whether our ring all-reduce keeps up with gloo's is measured by the benchmark
itself (`python -m distlab.collectives`), not asserted here.
"""

import json
import socket

import pytest
import torch.distributed as dist

from distlab.collectives import bench, busbw
from distlab.collectives.__main__ import main
from distlab.collectives.busbw import BUILTIN, COLLECTIVES, Row, busbw_factor
from distlab.collectives.measure import implementations_of

SPLIT = ("reduce_scatter", "all_gather", "all_to_all", "scatter", "gather")


@pytest.mark.parametrize(("collective", "n", "factor"), [
    ("all_reduce", 1, 0.0), ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75),
    ("reduce_scatter", 4, 0.75), ("all_gather", 8, 0.875), ("all_to_all", 2, 0.5),
    ("broadcast", 4, 1.0), ("reduce", 8, 1.0), ("scatter", 4, 0.75), ("gather", 4, 0.75),
])
def test_busbw_factor_is_the_one_in_nccl_tests_performance_md(collective, n, factor):
    assert busbw_factor(collective, n) == pytest.approx(factor)


def test_sizes_parse_like_nccl_tests_flags():
    assert busbw.parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert busbw.parse_sizes("4M:64M:4") == [4 << 20, 16 << 20, 64 << 20]
    assert busbw.parse_sizes("4M,16M, 100") == [4 << 20, 16 << 20, 100]
    assert busbw.parse_sizes(["1G", 5]) == [1 << 30, 5]
    assert busbw.parse_size("64mb") == 64 << 20


def _check_rows(rows, world_size, sizes, collectives):
    for c in collectives:
        impls = implementations_of(c)
        assert impls[-1] == BUILTIN and len(impls) >= 2
        for size in sizes:
            got = [r for r in rows if r.collective == c and r.world_size == world_size
                   and r.count * 4 <= size < (r.count + (world_size if c in SPLIT else 1)) * 4]
            assert sorted(r.implementation for r in got) == sorted(impls), (c, size)
            for r in got:
                assert r.dtype == "float32" and r.size == 4 * r.count and r.time_us > 0
                assert r.count % world_size == 0 or c not in SPLIT
                assert r.algbw_GBps == pytest.approx(r.size / (r.time_us * 1e-6) / 1e9)
                assert r.busbw_GBps == pytest.approx(r.algbw_GBps * busbw_factor(c, world_size))


def test_benchmark_on_two_ranks_gives_a_row_per_implementation_with_builtin_rows():
    sizes = [64, 1004]  # 1004 B = 251 floats: split collectives round down to 250, as nccl-tests does
    rows = bench.benchmark(2, COLLECTIVES, sizes, iters=1, warmup=1, repeats=1, progress=True)
    _check_rows(rows, 2, sizes, COLLECTIVES)
    assert {r.size for r in rows if r.collective == "all_gather"} == {64, 1000}
    ratios = busbw.ratio_table(rows)
    assert len(ratios) == sum(r.implementation != BUILTIN for r in rows)
    assert all(x.ratio > 0 and x.builtin_busbw_GBps >= 0 for x in ratios)
    table = busbw.format_table(rows).splitlines()
    assert table[0].startswith("#") and table[1].startswith("#") and len(table) == len(rows) + 2
    assert "segmented_ring_all_reduce" in busbw.format_ratio_table(ratios)


def test_command_line_on_one_and_three_ranks(capsys):
    rows = main(["--world-size", "1", "3", "--sizes", "100", "--collectives", "all_reduce",
                       "reduce_scatter", "--iters", "1", "--warmup", "0", "--repeats", "2"])
    out = capsys.readouterr().out
    assert "ring_reduce_scatter" in out and "ours/torch" in out
    _check_rows(rows, 1, [100], ["all_reduce", "reduce_scatter"])
    _check_rows(rows, 3, [100], ["all_reduce", "reduce_scatter"])
    one = [r for r in rows if r.world_size == 1 and r.collective == "all_reduce"]
    assert all(r.busbw_GBps == 0 for r in one)  # 2(n-1)/n = 0: nothing crosses a link
    assert all(x.ratio > 0 for x in busbw.ratio_table(rows))  # the ratio is a time ratio: defined on 1 rank


def test_ratio_table_is_builtin_time_over_ours():
    def row(impl, time_us, size=1 << 20, p=2):
        algbw = size / time_us / 1e3
        return Row("all_reduce", impl, p, size, size // 4, "float32", time_us, algbw, algbw)

    rows = [row("ring_all_reduce", 200.0), row(BUILTIN, 100.0), row("ring_all_reduce", 50.0, p=4),
            row(BUILTIN, 100.0, p=4), row("recursive_doubling_all_reduce", 100.0, size=64)]
    ratios = busbw.ratio_table(rows)  # the last row has no built-in partner: left out
    assert [(x.world_size, x.ratio) for x in ratios] == [(2, 0.5), (4, 2.0)]
    assert ratios[0].busbw_GBps / ratios[0].builtin_busbw_GBps == pytest.approx(0.5)


def test_command_line_under_torchrun_environment(monkeypatch, capsys):
    # What `torchrun --nproc-per-node 1 -m distlab.collectives ...` sets, in this very process
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    rows = main(["--sizes", "1K:2K", "--collectives", "all_gather", "--iters", "1", "--repeats", "1"])
    assert not dist.is_initialized()  # under_torchrun tore the group down again
    _check_rows(rows, 1, [1024, 2048], ["all_gather"])
    out = capsys.readouterr().out
    assert out.startswith("#") and out.count("ring_all_gather") == 4  # 2 table rows, 2 ratio rows


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sizes": [0]}, "size=0 in sizes must be a positive integer number of bytes"),
    ({"sizes": [1024, -4]}, "size=-4 in sizes must be a positive integer number of bytes"),
    ({"sizes": []}, "sizes is empty; pass at least one size in bytes"),
    ({"sizes": "0"}, "size='0' must be a positive number of bytes"),
    ({"sizes": "4X"}, "size '4X' is not a byte count; write e.g. 4096, '4K'"),
    ({"sizes": "8K:1K"}, "need MIN <= MAX and FACTOR >= 2"),
    ({"collectives": ["allreduce"]}, "unknown collective 'allreduce'; choose one of all_reduce, "),
    ({"world_size": 0}, "world_size=0 must be a positive integer number of ranks"),
    ({"world_size": 65}, "world_size=65 must be a positive integer number of ranks, at most 64"),
    ({"world_size": [2, -1]}, "world_size=-1 must be a positive integer number of ranks"),
    ({"implementations": ["ring"]}, "unknown implementation 'ring'; choose from "),
    ({"implementations": ["tree_broadcast"]}, "none of implementations=['tree_broadcast'] implements "
                                              "all_reduce; add one of ring_all_reduce"),
    ({"collectives": ["all_gather"], "sizes": [4]},
     "size=4 B is too small for all_gather on 2 ranks with 4-byte elements; use sizes of at least 8 B"),
    ({"repeats": 0}, "repeats=0 must be an integer >= 1, e.g. repeats=5"),
    ({"iters": 0}, "iters=0 must be an integer >= 1"),
    ({"dtype": "float8"}, "unknown dtype 'float8'; choose one of float32"),
    ({"over_ranks": "min"}, "unknown over_ranks 'min'; choose one of max, mean"),
])
def test_bad_input_is_refused_before_any_rank_starts(kwargs, message):
    args = {"world_size": 2, "collectives": ["all_reduce"], "sizes": [1024], **kwargs}
    with pytest.raises(ValueError) as info:
        bench.benchmark(**args)
    assert message in str(info.value)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: busbw_factor("alltoall", 2), "unknown collective 'alltoall'; choose one of"),
    (lambda: busbw_factor("all_reduce", 0), "n=0 must be a positive integer number of ranks"),
    (lambda: busbw.parse_sizes("1K:2K:3:4"), "must be MIN:MAX or MIN:MAX:FACTOR"),
])
def test_bad_input_to_helpers(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


@pytest.mark.parametrize(("argv", "message"), [
    (["--sizes", "abc"], "size 'abc' is not a byte count"),
    (["--world-size", "0"], "argument --world-size: 0 must be at least 1"),
    (["--world-size", "2", "100"], "world_size=100 must be a positive integer number of ranks, at most 64"),
    (["--world-size", "two"], "argument --world-size: 'two' is not a whole number"),
    (["--implementations", "ring"], "unknown implementation 'ring'; choose from"),
    (["--collectives", "allreduce"], "argument --collectives: invalid choice: 'allreduce'"),
    (["--repeats", "0"], "repeats=0 must be an integer >= 1"),
    (["--ranks-per-node", "0"], "ranks_per_node=0 must be >= 1"),
])
def test_command_line_refuses_bad_values_with_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m distlab.collectives") and message in err
    assert "Traceback" not in err


def test_command_line_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 4M:64M:4)", "(default: ['all_reduce'])", "(default: [2])", "(default: 5)",
                    "(default: float32)", "(default: max)", "(default: False)", "(default: None)"):
        assert default in out, default


def test_command_line_prints_json(capsys):
    rows = main(["--world-size", "2", "--sizes", "64", "--implementations", "ring_all_reduce", "torch",
                 "--iters", "1", "--warmup", "0", "--repeats", "1", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == [r.as_dict() for r in rows] and len(printed) == 2
