"""`run`'s arguments, checked before any rank starts: a bad value gets a ValueError naming it and the fix."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

MIN_TIMEOUT = 1.0  # seconds: the timeout also bounds start-up (init_process_group), which takes about that


def check_fn(fn: Any) -> None:
    if not callable(fn):
        raise ValueError(f"fn={fn!r} is not callable: pass the function itself, e.g. run(train, 2) and not "
                         "run(train(), 2)")


def check_world_size(world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive integer (the number of ranks), "
                         "e.g. run(fn, 4)")
    if world_size > 64:
        raise ValueError(f"world_size={world_size} starts {world_size} processes on one machine; "
                         "use at most 64 (on CPU, 2 to 8 is plenty to see every effect)")
    return world_size


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and value > 0


def check_timeout(timeout: Any) -> float:
    if not _seconds(timeout):
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds, e.g. timeout=30 "
                         "(finite: it also bounds how long a stuck rank is waited for)")
    if timeout < MIN_TIMEOUT:
        raise ValueError(f"timeout={timeout!r} is shorter than {MIN_TIMEOUT:g} s: the timeout also bounds "
                         "how long the ranks wait for each other to join at start-up (init_process_group), "
                         f"so the run would fail before it began; use timeout={MIN_TIMEOUT:g} or more")
    return float(timeout)


def check_deadline(deadline: Any) -> float | None:
    if deadline is not None and not _seconds(deadline):
        raise ValueError(f"deadline={deadline!r} must be a positive number of seconds that the whole run "
                         "may take, e.g. deadline=600, or None for no limit")
    return None if deadline is None else float(deadline)


def check_may_fail(may_fail: Any, world_size: int) -> set[int]:
    if may_fail is None:
        return set()
    ranks = list(may_fail) if isinstance(may_fail, Iterable) and not isinstance(may_fail, (str, bytes)) \
        else None
    if ranks is None or any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world_size
                            for r in ranks):
        raise ValueError(f"may_fail={may_fail!r} must list ranks from 0 to {world_size - 1}, "
                         "e.g. may_fail=[1] (a list even for one rank)")
    return set(ranks)
