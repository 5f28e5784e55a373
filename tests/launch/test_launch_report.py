"""The launcher's report, piece by piece, without starting ranks: how a rank's exception is classified,
where a stack says a rank is, how a RankError travels, which arguments are refused before any rank
starts, and what a terminal would show of a rank's output."""

from __future__ import annotations

import os
import pickle
import time

import cloudpickle
import pytest
import torch.distributed as dist

from distlab import launch
from distlab.launch import diagnosis, observe, results, sources, worker
from distlab.launch.diagnosis import RankState
from distlab.launch.sources import Frame

GLOO_RESET = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:63687: "
              "Connection reset by peer. This is typically caused by a remote worker hanging")
GLOO_TIMEOUT = "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms"


def _caught(make) -> BaseException:
    try:
        make()
    except BaseException as e:
        return e
    raise AssertionError("nothing was raised")


def _from_work_wait(message: str) -> None:
    raise RuntimeError(message)  # what Work.wait() raises: innermost Python frame is the caller's


def _wrapped() -> None:
    try:
        _from_work_wait(GLOO_RESET)
    except RuntimeError as e:
        raise RuntimeError("pipeline stage 1 could not receive its activations") from e


@pytest.mark.parametrize("make, kind", [
    (lambda: _from_work_wait(GLOO_RESET), "peer"),
    (lambda: _from_work_wait(GLOO_TIMEOUT), "timeout"),
    (lambda: _wrapped(), "peer"),  # a chapter's own error, raised from gloo's
    (lambda: (_ for _ in ()).throw(dist.DistNetworkError("Connection reset by peer")), "peer"),
    (lambda: _from_work_wait("my loader: connection reset by peer"), "raised"),  # the student's own words
    (lambda: (_ for _ in ()).throw(TimeoutError("the data loader timed out")), "raised"),
])
def test_symptoms_are_told_from_causes_also_when_they_come_out_of_work_wait(make, kind):
    assert worker.describe(_caught(make), {})["kind"] == kind


def test_rank_error_survives_pickling_as_a_nested_may_fail_run_returns_it():
    err = launch.RankError("rank 1 failed with ValueError: x", 1, "Traceback ...")
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)):
        back = loads(dumps(err))
        assert (type(back), str(back), back.rank, back.traceback) == (launch.RankError, str(err), 1,
                                                                      "Traceback ...")


def test_location_of_a_python_c_script_shows_its_frames_and_no_doubled_word():
    code = compile("def work():\n    x = 1\n    raise ValueError('bad')\n", "<string>", "exec")
    namespace: dict = {}
    exec(code, namespace)
    where = worker.describe(_caught(namespace["work"]), {})["where"]
    assert where == "work, at <string>, line 3", where
    dump = ('Current thread 0x01 (most recent call first):\n'
            '  File "<string>", line 3 in work\n'
            f'  File "{worker.__file__}", line 170 in _worker_main\n'
            '  File "<string>", line 1 in <module>\n')
    frames = sources.parse_dump(dump)
    assert frames == [Frame("<string>", 3, "work")]
    assert sources.where(frames, {}) == "work, at <string>, line 3"
    assert sources.format_stack(frames, {}) == '  File "<string>", line 3, in work'
    init = [Frame(worker.__file__, 180, "init_rank"),
            Frame("/x/torch/distributed/distributed_c10d.py", 1, "init_process_group")]
    state = RankState(0, 1, error={"kind": "timeout", "where": sources.where(init, {}), "message": "",
                                   "type": "DistStoreError", "traceback": ""})
    line = diagnosis.describe_rank(state, 2.0)
    assert line == "timed out after 2 s in init_process_group, before the function started", line


def test_keyboard_interrupt_in_a_rank_reads_without_a_stray_colon():
    s = RankState(1, 1, allowed=True, error={"kind": "raised", "where": "f, at x.py, line 1",
                                             "message": "", "type": "KeyboardInterrupt", "traceback": ""})
    assert str(diagnosis.own_error(s)) == "rank 1 failed with KeyboardInterrupt"
    assert diagnosis.describe_rank(s, 1.0) == "raised KeyboardInterrupt, in f, at x.py, line 1"


def test_dead_rank_is_timed_by_its_fatal_dump_not_by_when_the_launcher_noticed(tmp_path):
    (tmp_path / "rank0.fatal").write_text("Fatal Python error: Aborted\n")
    died = time.time() - 5
    os.utime(tmp_path / "rank0.fatal", (died, died))

    class Exited:
        pid = 0

        def poll(self) -> int:
            return -6

    s = observe.state(0, Exited(), tmp_path, set(), {0: time.time()}, [], {})
    assert s.died and abs(s.at - died) < 1e-3


def _f() -> None:
    pass


@pytest.mark.parametrize("call, message", [
    (lambda: launch.run(5, 2), r"fn=5 is not callable: pass the function itself, e.g. run\(train, 2\)"),
    (lambda: launch.run(_f, 2, timeout=1e-4), r"timeout=0.0001 is shorter than 1 s: the timeout also bounds"),
    (lambda: launch.run(_f, 2, deadline=0), r"deadline=0 must be a positive number of seconds"),
    (lambda: launch.run(_f, 2, deadline=float("inf")), r"deadline=inf must be a positive number"),
])
def test_bad_arguments_are_refused_before_any_rank_starts(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("raw, shown", [
    ("done\r", "done"), ("progress 10%\rprogress 100%\r", "progress 100%"), ("a\rb", "b"), ("plain", "plain"),
])
def test_a_line_ending_in_carriage_return_keeps_its_text(raw, shown):
    assert results.visible(raw) == shown


def test_output_with_windows_line_ends_is_printed(tmp_path, capsys):
    (tmp_path / "rank0.out").write_bytes(b"first\r\n10%\r100%\r\nlast")
    results.print_output(tmp_path, 1)
    assert capsys.readouterr().out.splitlines() == ["[rank 0] first", "[rank 0] 100%", "[rank 0] last"]
