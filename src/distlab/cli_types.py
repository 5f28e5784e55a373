"""Argument types for the chapters' command lines (`python -m distlab.<chapter>`), in one place.

argparse calls a `type=` function on the option's text and, when it raises `argparse.ArgumentTypeError`,
prints `argument --NAME: <message>` and exits with status 2. Every chapter's command line takes its whole
numbers and sizes through these, so a bad value reads the same everywhere:

    argument --world-size: 0 must be at least 1
    argument --batch: 'two' is not a whole number
    argument --params: 'many' is not a number
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _parse(text: str, kind: type) -> int | float:
    """`text` as a `kind` (int or float); an int may be written as 7.5e9 (a whole number in e-notation)."""
    what = "whole number" if kind is int else "number"
    try:
        value = float(text) if kind is float or "e" in text.lower() else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
    if not math.isfinite(value) or (kind is int and value != int(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what}")
    return int(value) if kind is int else value


def at_least(low: float, kind: type = int) -> Callable[[str], int | float]:
    """An argparse `type=` that reads a `kind` (int or float) of at least `low`.

    `at_least(1)` is a positive whole number; `at_least(0, float)` a non-negative real number."""
    if kind not in (int, float):
        raise ValueError(f"kind={kind!r} must be int or float")

    def parse(text: str) -> int | float:
        value = _parse(text, kind)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} must be at least {low:g}")
        return value

    parse.__name__ = f"at_least_{low:g}_{kind.__name__}"
    return parse


def positive_int(text: str) -> int:
    """An argparse `type=`: a whole number of at least 1 (ranks, steps, rounds, bytes)."""
    return at_least(1)(text)


def between(low: float, high: float, kind: type = int, why: str = "") -> Callable[[str], int | float]:
    """An argparse `type=` that reads a `kind` from `low` to `high`; `why` says where the upper bound
    comes from (for example "no GPU cluster has more"), so that an absurd value is refused with a reason:

        argument --params: 1e30 must be at most 1e+15 (100 times the largest dense model trained)
    """
    floor = at_least(low, kind)

    def parse(text: str) -> int | float:
        value = floor(text)
        if value > high:
            reason = f" ({why})" if why else ""
            raise argparse.ArgumentTypeError(f"{text} must be at most {high:g}{reason}")
        return value

    parse.__name__ = f"between_{low:g}_{high:g}_{kind.__name__}"
    return parse
