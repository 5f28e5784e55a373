"""The write guard of a grading process: an audit hook (PEP 578) that refuses writes outside its folder.

`distlab grade` runs a student's code in a child process whose working folder, home and temporary
folder all lie inside one fresh temporary folder (`DISTLAB_GRADE_ROOT`). This file is that child's
`sitecustomize.py` (the grader copies it there and puts the copy first on `PYTHONPATH`), so every Python
process the child starts, the rank helper of `distlab.launch` and the ranks it forks included, installs
the hook before any other code runs. The hook refuses, with a `PermissionError`:

- opening a file for writing (``open``, ``io.open``, ``os.open`` with a write flag) outside the root;
- removing, renaming, linking, truncating, chmod-ing or making a folder outside the root;
- sending a signal to the grader itself, its process group, or every process (pid -1);
- starting a program other than this Python interpreter (which would not carry the hook) and a few that
  only read (`READ_ONLY_PROGRAMS`: matplotlib's font list, the doctor's probes),

and appends one line per refusal to `DISTLAB_GRADE_ROOT/forbidden.log`, so the grader sees the attempt even
when the student's code catches the error.

What it does not stop (the docs say so too): code that goes below Python (ctypes, a C extension), writes
through a file descriptor it inherited, or a determined student who removes the hook's effect from
inside the process (audit hooks cannot be removed, but the verdicts are computed in the same process).
It guards against accidents and casual tampering; grade an adversarial class in a container or a VM.

This file imports nothing from `distlab`: it runs before the package is importable.
"""

from __future__ import annotations

import os
import sys

ROOT_ENV = "DISTLAB_GRADE_ROOT"
PROTECT_ENV = "DISTLAB_GRADE_ENGINE"  # the grader's own process id, which no signal may reach
LOG_NAME = "forbidden.log"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_ALLOWED_DEVICES = ("/dev/null", "/dev/shm/")
# audit event -> the positions of its path arguments (Python's audit events table)
_PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
                "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,),
                "os.mkdir": (0,), "shutil.rmtree": (0,), "os.utime": (0,), "os.setxattr": (0,),
                "os.removexattr": (0,), "sqlite3.connect": (0,)}
_SPAWN_EVENTS = ("os.system", "os.exec", "os.posix_spawn", "os.spawn")
# Programs the course's libraries start and that only read: matplotlib's font list, the doctor's probes.
READ_ONLY_PROGRAMS = ("fc-list", "fc-match", "uname", "nvidia-smi", "lscpu")


def _wants_write(mode: object, flags: object) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _allowed_program(args: tuple) -> bool:
    """True when a `subprocess.Popen` audit event (executable, args, cwd, env) starts a read-only program
    or this interpreter with its site module (so with this hook): not with -I, -S or -E, which skip it."""
    argv = [args[1]] if isinstance(args[1], str | bytes) else list(args[1] or [])
    program = args[0] or (argv[0] if argv else "")
    try:
        name = os.fsdecode(program)
    except TypeError:
        return False
    if os.path.basename(name) in READ_ONLY_PROGRAMS:
        return True
    same = os.path.realpath(name) == os.path.realpath(sys.executable)
    return not _skips_site(argv[1:]) and same


def _skips_site(options: list) -> bool:
    """True when the interpreter options before the script or -c/-m (`options`) hold -I, -S or -E."""
    for arg in (os.fsdecode(a) for a in options):
        if not arg.startswith("-") or arg in ("-c", "-m") or arg.startswith("--"):
            break
        if set(arg[1:]) & set("ISE"):
            return True
    return False


class _Guard:
    """The hook's state: the root it allows, the log it appends to, and whether it is logging now."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.log = os.path.join(self.root, LOG_NAME)
        self.busy = False
        self.protected = {-1}  # the grader, its process group (kill(-pgid), killpg), every process (-1)
        engine = os.environ.get(PROTECT_ENV, "")
        if engine.isdigit():
            self.protected.add(int(engine))
            try:
                self.protected |= {os.getpgid(int(engine)), -os.getpgid(int(engine))}
            except OSError:
                pass

    def inside(self, path: object) -> bool:
        """True for a path under the root (or /dev/null, /dev/shm), and for a file descriptor."""
        if isinstance(path, int):  # a file descriptor (os.truncate(fd), fchmod): already open
            return True
        try:
            full = os.path.realpath(os.fsdecode(path))
        except TypeError:
            return True
        return (full == self.root or full.startswith(self.root + os.sep)
                or any(full == d.rstrip("/") or full.startswith(d) for d in _ALLOWED_DEVICES))

    def refuse(self, what: str) -> None:
        """Log `what` (once, even when the caller catches the error) and raise PermissionError."""
        self.busy = True
        try:
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(fd, (what.replace("\n", " ") + "\n").encode())
            os.close(fd)
        except OSError:
            pass
        finally:
            self.busy = False
        raise PermissionError(f"distlab grade: {what} is not allowed while grading (only the temporary "
                              "folder of this run may be written)")

    def __call__(self, event: str, args: tuple) -> None:
        if self.busy:
            return
        what = self._refusal(event, args)
        if what is not None:
            self.refuse(what)

    def _refusal(self, event: str, args: tuple) -> str | None:
        """What the audit event `event` with `args` attempts, when it is not allowed; None when it is."""
        if event == "open":
            return self._open_refusal(args)
        if event in _PATH_EVENTS:
            return self._path_refusal(event, args)
        if event == "subprocess.Popen":
            return None if _allowed_program(args) else f"starting the program {args[1]!r}"
        if event in ("os.kill", "os.killpg"):
            protected = args and args[0] in self.protected
            return f"sending a signal to process {args[0]} (the grader)" if protected else None
        if event in _SPAWN_EVENTS:
            return f"starting a program ({event})"
        return None

    def _open_refusal(self, args: tuple) -> str | None:
        """An `open` event that writes outside the root: "writing to <path>"."""
        if len(args) >= 3 and _wants_write(args[1], args[2]) and not self.inside(args[0]):
            return f"writing to {args[0] if isinstance(args[0], int) else os.fsdecode(args[0])}"
        return None

    def _path_refusal(self, event: str, args: tuple) -> str | None:
        """A path event (remove, rename, mkdir, ...) with its first path argument outside the root."""
        for i in _PATH_EVENTS[event]:
            if i < len(args) and not self.inside(args[i]):
                return f"{event} on {args[i]}"
        return None


def install(root: str) -> None:
    """Install the hook for `root` (an absolute folder); every write outside it is refused and logged."""
    sys.addaudithook(_Guard(root))


if os.environ.get(ROOT_ENV):  # as sitecustomize.py in a grading process: guard it from the start
    install(os.environ[ROOT_ENV])
