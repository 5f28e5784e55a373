"""Ranks forked from the launcher's helper (`distlab.launch.zygote`) are the ranks `python -c` would start:
the same environment, folder, path and modules, a session of their own, and a fresh copy of any module the
student edits between runs. The helper is replaced when it dies, and `DISTLAB_LAUNCH_FORK=0` turns it off."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from distlab import launch
from distlab.launch import zygote

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork helper is Linux-only")


def _what_a_rank_sees(module: str) -> dict:
    import importlib

    import torch

    return {"env": os.environ.get("DISTLAB_TEST_VALUE"), "cwd": os.getcwd(), "ppid": os.getppid(),
            "session_leader": os.getsid(0) == os.getpid(), "threads": torch.get_num_threads(),
            "value": importlib.import_module(module).VALUE,
            "distlab": sys.modules["distlab"].__file__, "stdin": sys.stdin.read()}


def test_a_forked_rank_sees_what_a_fresh_process_would(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_TEST_VALUE", "seen")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "edited_by_student.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = launch.run(_what_a_rank_sees, 2, "edited_by_student")
    (tmp_path / "edited_by_student.py").write_text("VALUE = 2\n")  # the student edits the module
    second = launch.run(_what_a_rank_sees, 2, "edited_by_student")
    helper = zygote.helper()
    for seen in first + second:
        assert seen["env"] == "seen" and seen["cwd"] == str(tmp_path) and seen["session_leader"]
        assert seen["ppid"] == helper.proc.pid, "the ranks were not forked by this process's helper"
        assert seen["threads"] == max(1, (os.cpu_count() or 1) // 2)  # gloo ranks share the cores
        assert seen["distlab"] == sys.modules["distlab"].__file__ and seen["stdin"] == ""
    assert [s["value"] for s in first + second] == [1, 1, 2, 2]


def _parent() -> int:
    return os.getppid()


def test_a_dead_helper_is_replaced_and_fork_can_be_turned_off(monkeypatch):
    helper = zygote.helper()
    os.kill(helper.proc.pid, signal.SIGKILL)
    helper.proc.wait()
    parent = launch.run(_parent, 1)[0]
    assert zygote.helper() is not helper and parent == zygote.helper().proc.pid  # a new helper forked it
    monkeypatch.setenv("DISTLAB_LAUNCH_FORK", "0")
    assert not zygote.usable()
    assert launch.run(_parent, 2) == [os.getpid()] * 2  # python -c children of this process


def _signal_dispositions() -> dict:
    return {name: signal.getsignal(getattr(signal, name)) for name in ("SIGPIPE", "SIGINT", "SIGTERM")}


def test_a_forked_rank_handles_signals_as_a_fresh_python(monkeypatch):
    # SIGPIPE ignored (a write to a peer's closed socket raises instead of killing the rank, so the report
    # blames the rank that failed), Ctrl-C a KeyboardInterrupt, SIGTERM the default.
    forked = launch.run(_signal_dispositions, 1)[0]
    monkeypatch.setenv("DISTLAB_LAUNCH_FORK", "0")
    fresh = launch.run(_signal_dispositions, 1)[0]
    assert forked == fresh
    assert forked["SIGPIPE"] == signal.SIG_IGN and forked["SIGINT"] is signal.default_int_handler
