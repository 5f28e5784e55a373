"""What the launcher knows about one rank, and the line of a report that says what it did.

`RankState` is one rank at the moment a report is written: its exit status (or still running), its
error as `worker.describe` wrote it, its Python stack. `describe_rank` turns it into one line ("raised
ValueError: ..., in f, at x.py, line 3", "was killed by SIGKILL (signal 9) ...", "still running, in
..."), with a hint for each fatal signal. `RankError` is the exception a failed launch raises; the
choice of which rank caused a failure, and the whole report, are `diagnosis.py`'s.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from distlab.launch.sources import TORCH_DIST, Frame, where

_SIGNAL_HINTS = {
    "SIGKILL": "SIGKILL cannot be caught, and nothing here says who sent it: a script or a person (kill -9), "
               "or the out-of-memory killer if the machine ran short of memory (`dmesg` lists its kills)",
    "SIGSEGV": "SIGSEGV is a crash in native code (C++ or CUDA: a bad pointer, mismatched libraries)",
    "SIGABRT": "SIGABRT means native code aborted: a failed C++ check (gloo: a message of the wrong size), "
               "or NCCL's watchdog ending a collective that waited too long",
    "SIGBUS": "SIGBUS usually means shared memory (/dev/shm) ran out or a memory-mapped file shrank",
    "SIGFPE": "SIGFPE is an arithmetic fault in native code, such as an integer division by zero",
}


class RankError(RuntimeError):
    """A rank failed. `rank` is the rank that caused it; `traceback` is that rank's own traceback."""

    def __init__(self, message: str, rank: int, traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback

    def __reduce__(self) -> tuple:
        """Pickle with all three fields (a rank may return one from a nested run, may_fail)."""
        return type(self), (str(self), self.rank, self.traceback)


@dataclass
class RankState:
    """What the launcher knows about one rank when it writes a report.

    code: exit status (negative: killed by that signal), None while running. at: when it returned or
    failed (time.time()); ended: the same in seconds after the function started on the ranks. error: its
    exception, as `worker.describe` wrote it. frames: its Python stack, if it is still running."""

    rank: int
    code: int | None
    at: float = 0.0
    ended: float | None = None
    error: dict | None = None
    returned: bool = False
    started: bool = True
    joined: bool = True
    allowed: bool = False
    frames: list[Frame] = field(default_factory=list)
    sources: dict[str, dict] = field(default_factory=dict)
    said: str = ""

    @property
    def died(self) -> bool:
        """Exited without an error report, with a failure status or before its function returned:
        os._exit (even os._exit(0)), a signal, a crash."""
        return self.code is not None and self.error is None and (self.code != 0 or not self.returned)

    @property
    def communicating(self) -> bool:
        """Still running, inside a torch.distributed call (from its Python stack)."""
        return self.code is None and any(TORCH_DIST in f.file for f in self.frames)

    @property
    def kind(self) -> str:
        if self.error is not None:
            return self.error["kind"]
        return "died" if self.died else "running" if self.code is None else "returned"


def _death(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name} (signal {-code})"
    except ValueError:
        return f"was killed by signal {-code}"


def _hint(code: int) -> str:
    if code == 0:
        return "Something called os._exit(0) before the function returned (sys.exit would have raised)"
    name = signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else ""
    return _SIGNAL_HINTS.get(name, "Something called os._exit, or native code ended the process")


def _raised(e: dict) -> str:
    if e["message"] is None:
        return f"{e['type']} (its message could not be printed: {e['unprintable']})"
    return f"{e['type']}: {e['message']}" if e["message"] else e["type"]


def _death_report(s: RankState) -> str:
    """Why rank s died, what native code said as it did, and where the rank was."""
    text = f"rank {s.rank} {_death(s.code)} without raising a Python exception. {_hint(s.code)}."
    if s.said:
        text += f" Native code said: {s.said}."
    if s.returned:  # its result was written: it died on the way out (worker._exit), not in the function
        text += " Its function had returned and its result was written; it died while the process ended."
    elif s.frames:
        text += f" The rank was in {where(s.frames, s.sources)}."
    return text


def describe_rank(s: RankState, timeout: float, deadlock: bool = False) -> str:
    """One line: what rank s did, and where. In a deadlock every waiting rank "waited in" its operation
    (which of them hit the timeout first, and which then lost its connection, is a race)."""
    if s.error is not None:
        e = s.error
        if deadlock and e["kind"] in ("timeout", "peer"):
            return f"waited in {e['where']}"
        what = {"timeout": f"timed out after {timeout:g} s in", "peer": "lost its connection to a peer in"}
        return f"{what.get(e['kind'], f'raised {_raised(e)}, in')} {e['where']}"
    if s.died:
        return f"{_death(s.code)} without raising a Python exception"
    if s.code == 0:
        at = f" at {s.ended:.1f} s" if s.ended is not None else ""
        return f"returned normally{at}"
    if not s.joined:
        at = f", in {where(s.frames, s.sources)}" if s.frames else ""
        return f"still starting: it had not reached init_process_group{at}"
    if not s.started:
        return "still joining the process group (it had not called the function yet)"
    return f"still running, in {where(s.frames, s.sources)}" if s.frames else "still running"
