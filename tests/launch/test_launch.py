"""The launcher: results, rank output, backends, bad arguments, torchrun and may_fail.

Its reports of failed runs are tested in test_launch_diagnosis.py; what is left behind after an
interrupt, a signal or a killed launcher in test_launch_cleanup.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from distlab import launch


def alive(pid: int) -> bool:
    """True if the process exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pids: list[int], seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def script(tmp_path: Path, body: str) -> Path:
    """A program whose functions live in __main__, as a notebook's do."""
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(body))
    return path


# --- results, helpers inside a rank, output ---------------------------------------------------------

def _facts(scale: int, offset: int = 0) -> dict:
    t = torch.tensor([float(launch.rank() + 1)])
    dist.all_reduce(t)
    print(f"rank {launch.rank()} of {launch.world_size()} says hello")
    return {"rank": launch.rank(), "world": launch.world_size(), "local": launch.local_rank(),
            "device": str(launch.device()), "backend": launch.backend(), "sum": t.item() * scale + offset,
            "env": (os.environ["RANK"], os.environ["WORLD_SIZE"]), "pid": os.getpid()}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_results_in_rank_order_and_output_grouped(world_size, capsys):
    results = launch.run(_facts, world_size, 10, offset=1, backend="gloo")
    total = world_size * (world_size + 1) / 2
    assert [r["rank"] for r in results] == list(range(world_size))
    for r in results:
        assert r["world"] == world_size and r["local"] == r["rank"]
        assert r["device"] == "cpu" and r["backend"] == "gloo"
        assert r["sum"] == total * 10 + 1
        assert r["env"] == (str(r["rank"]), str(world_size))
    out = capsys.readouterr().out.splitlines()
    assert out == [f"[rank {r}] rank {r} of {world_size} says hello" for r in range(world_size)]
    assert wait_gone([r["pid"] for r in results]) == []


def _reverse_order_print(lines: int) -> int:
    time.sleep(0.3 * (launch.world_size() - launch.rank()))  # rank 0 prints last in wall-clock time
    for i in range(lines):
        print(f"line {i}", flush=True)
    print("progress 10%\rprogress 100%")
    return launch.rank()


def test_output_is_grouped_by_rank_even_when_ranks_print_out_of_order(capsys):
    assert launch.run(_reverse_order_print, 3, 2) == [0, 1, 2]
    out = capsys.readouterr().out.splitlines()
    expected = []
    for r in range(3):
        expected += [f"[rank {r}] line 0", f"[rank {r}] line 1", f"[rank {r}] progress 100%"]
    assert out == expected


@pytest.mark.parametrize("world, gpus, nccl, expected", [
    (2, 2, True, "nccl"), (2, 4, True, "nccl"), (4, 2, True, "gloo"), (1, 0, True, "gloo"),
    (2, 8, False, "gloo"),
])
def test_choose_backend_needs_nccl_and_one_gpu_per_rank(world, gpus, nccl, expected):
    assert launch.choose_backend(world, gpus, nccl) == expected


def test_auto_backend_is_gloo_without_gpus():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA GPUs")
    assert launch.resolve_backend("auto", 2) == "gloo"
    assert launch.run(launch.backend, 1) == ["gloo"]


def test_concurrent_launches_do_not_collide():
    results: dict[int, list] = {}

    def go(k: int) -> None:
        results[k] = launch.run(_facts, 2, k)

    threads = [threading.Thread(target=go, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["sum"] for r in results[1]] == [3.0, 3.0]
    assert [r["sum"] for r in results[2]] == [6.0, 6.0]


def test_helpers_outside_a_rank_say_where_to_call_them():
    with pytest.raises(RuntimeError, match=r"launch.rank\(\) needs a process group.*distlab.launch.run"):
        launch.rank()


# --- bad arguments ----------------------------------------------------------------------------------

def _unpicklable_result():
    return threading.Lock()


def test_unpicklable_result_and_argument():
    with pytest.raises(launch.RankError, match="returned a lock, which cannot be pickled"):
        launch.run(_unpicklable_result, 1)
    with pytest.raises(TypeError, match="could not send the function and its arguments"):
        launch.run(_facts, 1, threading.Lock())


@pytest.mark.parametrize("bad", [0, -2, 2.5, "2", True])
def test_bad_world_size(bad):
    with pytest.raises(ValueError, match=rf"world_size={bad!r} must be a positive integer"):
        launch.run(_facts, bad)


def test_bad_backend():
    with pytest.raises(ValueError, match="backend='mpi' is not known; use 'auto', 'gloo'"):
        launch.run(_facts, 2, backend="mpi")


@pytest.mark.parametrize("bad", [0, -1.5, float("nan"), float("inf"), "3", None, True])
def test_bad_timeout_is_refused_before_any_rank_starts(bad):
    with pytest.raises(ValueError, match=rf"timeout={re.escape(repr(bad))} must be a positive number of "
                                         r"seconds, e.g. timeout=30 \(finite"):
        launch.run(_facts, 2, timeout=bad)


def test_nccl_without_gpus_is_a_clear_error():
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs for NCCL")
    with pytest.raises(ValueError, match=r"backend='nccl' needs one CUDA GPU per rank: world_size=2 but"):
        launch.run(_facts, 2, backend="nccl")


# --- torchrun ---------------------------------------------------------------------------------------

def test_same_worker_code_runs_under_torchrun(tmp_path):
    prog = script(tmp_path, """
        import torch, torch.distributed as dist
        from distlab import launch

        def work():
            t = torch.tensor([launch.rank() + 1.0])
            dist.all_reduce(t)
            print(f"torchrun rank {launch.rank()}/{launch.world_size()} {launch.backend()} sum={t.item():g}")

        launch.under_torchrun(work)
    """)
    torchrun = Path(sys.executable).with_name("torchrun")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(prog)],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, TMPDIR=str(tmp)))
    assert out.returncode == 0, out.stderr
    assert "torchrun rank 0/2 gloo sum=3" in out.stdout and "torchrun rank 1/2 gloo sum=3" in out.stdout
    # torchrun itself (torch.distributed.elastic's DefaultLogsSpecs, without --log-dir) leaves a
    # torchelastic_* tree of empty folders in the temporary directory; here it is this test's, and
    # nothing else is left: no file, and no folder of distlab's
    assert all(f.name.startswith("torchelastic_") for f in tmp.iterdir())
    assert [f for f in tmp.rglob("*") if f.is_file()] == []


def test_under_torchrun_outside_torchrun_explains(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="start the program with `torchrun --nproc-per-node N"):
        launch.under_torchrun(print)


# --- may_fail: ranks allowed to fail (for fault experiments) -----------------------------------------

def _some_ranks_fail() -> int:
    if launch.rank() == 1:
        raise RuntimeError("rank 1 gives up")
    if launch.rank() == 2:
        os._exit(3)
    time.sleep(0.5)  # still running when the others have failed: the run must not be stopped
    return launch.rank() * 10


def test_may_fail_returns_the_errors_of_allowed_ranks_and_the_others_results():
    results = launch.run(_some_ranks_fail, 4, may_fail=[1, 2])
    assert results[0] == 0 and results[3] == 30
    assert isinstance(results[1], launch.RankError) and results[1].rank == 1
    assert "rank 1 failed with RuntimeError: rank 1 gives up" in str(results[1])
    assert "rank 1 gives up" in results[1].traceback
    assert isinstance(results[2], launch.RankError)
    assert str(results[2]).startswith("rank 2 exited with code 3 without raising a Python exception. "
                                      "Something called os._exit")
    with pytest.raises(launch.RankError, match="rank 2 exited with code 3"):  # not allowed: the run fails
        launch.run(_some_ranks_fail, 4, may_fail=[1])


@pytest.mark.parametrize("bad", [[4], [-1], ["1"], [True], 5, "1", 2.0])
def test_bad_may_fail(bad):
    with pytest.raises(ValueError, match=rf"may_fail={re.escape(repr(bad))} must list ranks from 0 to 3, "
                                         r"e.g. may_fail=\[1\] \(a list even for one rank\)"):
        launch.run(_facts, 4, may_fail=bad)
