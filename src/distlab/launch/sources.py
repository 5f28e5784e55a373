"""Where a rank is in its code: the source it runs, and the operation and line it stopped at.

cloudpickle renames the file of every function it sends by value (one typed into a notebook cell or a
script's `__main__`) to "<dynamic-code>", and a notebook cell has no file on disk at all. So the launcher
pickles code objects with their real file names (`dumps`), and sends the source lines of the files that
exist only in the parent's `linecache` (notebook cells, `capture`; reports call them "<notebook cell>").
A rank registers them (`register`), so its traceback shows the failing line; the parent uses the same
names for the stacks of live ranks (from faulthandler's dump, `parse_dump`).

`where` reads a stack the way a student would: the `torch.distributed` operation a rank waits in, and
the line of the student's code that called it.
"""

from __future__ import annotations

import io
import linecache
import os
import re
import sys
import tokenize
import types
from collections import ChainMap
from typing import Any, NamedTuple

import cloudpickle
from cloudpickle.cloudpickle import _code_reduce

_DYNAMIC = "<dynamic-code>"
CELL = "<notebook cell>"
_TORCH = os.sep + "torch" + os.sep
TORCH_DIST = os.sep + os.path.join("torch", "distributed") + os.sep
_LAUNCH = os.path.dirname(os.path.abspath(__file__)) + os.sep


class Frame(NamedTuple):
    """One frame of a stack, outermost first: its file, line number and function name."""

    file: str
    line: int
    name: str


def _code_keeping_file(code: types.CodeType) -> tuple:
    rebuild, args = _code_reduce(code)
    return rebuild, tuple(code.co_filename if a == _DYNAMIC else a for a in args)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, except that code sent by value keeps its file name (for tracebacks)."""

    dispatch_table = ChainMap({types.CodeType: _code_keeping_file}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """Serialise `obj` like `cloudpickle.dumps`, keeping the file names of code sent by value."""
    buffer = io.BytesIO()
    _Pickler(buffer).dump(obj)
    return buffer.getvalue()


def _cell_name(file: str) -> str | None:
    """"<notebook cell>" for the file of a cell IPython ran, else None.

    Not IPython's own "Cell In[3]": the execution count differs between a notebook run by hand, by
    nbconvert and by nbval, and a lab's stored report must read the same every time."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    label = getattr(getattr(shell, "compile", None), "format_code_name", lambda f: None)(file)
    return CELL if label else None


def capture() -> dict[str, dict]:
    """The sources a rank cannot read from disk: every `linecache` entry with no file behind it."""
    found = {}
    for file, entry in list(linecache.cache.items()):
        if len(entry) == 4 and not os.path.exists(file):
            found[file] = {"lines": list(entry[2]), "name": _cell_name(file)}
    return found


def register(sources: dict[str, dict]) -> None:
    """In a rank: put the parent's notebook sources into `linecache` (mtime None: never invalidated)."""
    for file, s in sources.items():
        linecache.cache[file] = (sum(map(len, s["lines"])), None, s["lines"], file)


def display(file: str, sources: dict[str, dict]) -> str:
    """How a report names a file: "<notebook cell>" for a cell, a path relative to here if it can."""
    name = sources.get(file, {}).get("name")
    if name:
        return name
    if os.path.isabs(file) and file.startswith(os.getcwd() + os.sep):
        return os.path.relpath(file)
    return file


def rename_cells(text: str, sources: dict[str, dict]) -> str:
    """Name the cells in a traceback: `File "/tmp/ipykernel_7/31.py"` -> `File "<notebook cell>"`."""
    for file, s in sources.items():
        if s.get("name"):
            text = text.replace(f'File "{file}"', f'File "{s["name"]}"')
    return text


def _code(file: str, line: int) -> str:
    """The source of one line, without its comment (the report puts its own words after it)."""
    text = linecache.getline(file, line).strip()
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                return text[:token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):  # the first line of a statement that goes on
        pass
    return text


def _internal(f: Frame) -> bool:
    return _TORCH in f.file or f.file.startswith(_LAUNCH)


def _startup(frames: list[Frame]) -> str:
    """Where a rank is before its function started: in init_process_group, or elsewhere in the launcher."""
    ops = [f.name for f in frames if f.file.endswith("distributed_c10d.py")]
    return f"{ops[0]}, before the function started" if ops else \
        "the launcher's start-up, before the function started"


def where(frames: list[Frame], sources: dict[str, dict]) -> str:
    """'all_reduce, at <notebook cell>, line 7: dist.all_reduce(t)': the operation a rank is in and its line.

    The operation is the `torch.distributed` function the student's code called (none if the rank is
    outside communication); the line is the innermost frame of the student's code."""
    user = [i for i, f in enumerate(frames) if not _internal(f)]
    if not user:
        return _startup(frames)
    caller, called = frames[user[-1]], frames[user[-1] + 1:]
    op = _operation(called)
    code = _code(caller.file, caller.line)
    place = f"{display(caller.file, sources)}, line {caller.line}" + (f": {code}" if code else "")
    return f"{op}, at {place}" if op else f"{caller.name}, at {place}"


def _operation(called: list[Frame]) -> str:
    """The `torch.distributed` function that the frames below the student's code are in ("" if none)."""
    ops = ([f.name for f in called if f.file.endswith("distributed_c10d.py")]
           or [f.name for f in called if TORCH_DIST in f.file and f.name != "wrapper"])
    return ops[0] if ops else ""


_DUMP_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')


def parse_dump(text: str) -> list[Frame]:
    """The main thread's stack from a faulthandler dump of every thread, outermost first, from the frame
    that `_worker_main` called on (the `python -c` line and `_worker_main` itself are the launcher's).

    faulthandler lists each thread's frames innermost first; the main thread is the one running the
    launcher's `_worker_main`."""
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text):
        matches = [m for m in map(_DUMP_FRAME.match, block.splitlines()) if m]
        frames = [Frame(m[1], int(m[2]), m[3].strip()) for m in matches][::-1]
        outer = [i for i, f in enumerate(frames) if f.name == "_worker_main" and f.file.startswith(_LAUNCH)]
        if outer:
            return frames[outer[0] + 1:]
    return []


def format_stack(frames: list[Frame], sources: dict[str, dict]) -> str:
    """A live rank's stack in traceback form, without the launcher's own frames."""
    lines = []
    for f in frames:
        if f.file.startswith(_LAUNCH):
            continue
        lines.append(f'  File "{f.file}", line {f.line}, in {f.name}')
        code = linecache.getline(f.file, f.line).strip()
        if code:
            lines.append(f"    {code}")
    return rename_cells("\n".join(lines), sources)
