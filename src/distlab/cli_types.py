"""The command lines (`python -m distlab.<chapter>`): argument types and common options, in one place.

argparse calls a `type=` function on the option's text and, when it raises `argparse.ArgumentTypeError`,
prints `argument --NAME: <message>` and exits with status 2. Every chapter's command line takes its whole
numbers and sizes through these, so a bad value reads the same everywhere:

    argument --world-size: 0 must be at least 1
    argument --batch: 'two' is not a whole number
    argument --params: 'many' is not a number
    argument --size: '4X' is not a size such as 4096, 64K, 4M, 1G or 1e6

The options every entry point shares have one name, one type and a help text that shows the default
(CONTRIBUTING, "The same role, the same file name"): `add_world_size` (--world-size), `add_seed`
(--seed), `add_dtype` (--dtype, a name of `DTYPES`), `add_steps` (--steps) and `add_json` (--json).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence

import torch

# The floating-point dtypes a run can be asked for by name (`--dtype float32`); distlab.parity holds the
# tolerance of each.
DTYPES: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32,
                                  "float16": torch.float16, "bfloat16": torch.bfloat16}
SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}  # binary, as nccl-tests reads -b 64K -e 1G


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


def non_negative_int(text: str) -> int:
    """An argparse `type=`: a whole number of at least 0 (a seed, an optional count)."""
    return at_least(0)(text)


def size(text: str) -> int:
    """An argparse `type=`: a positive number of bytes (or elements), plain (4096), with a binary suffix
    K, M or G as nccl-tests writes them (64K = 65536, 4M, 1G), or in e-notation (1e6)."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMG]?)\s*", text)
    try:
        value = _parse(match.group(1), int) * SUFFIXES[match.group(2)] if match else None
    except argparse.ArgumentTypeError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 4096, 64K, 4M, 1G or 1e6")
    return value


def add_world_size(p: argparse.ArgumentParser, default: int | list[int] | None, help: str,
                   nargs: str | None = None) -> None:
    """--world-size N: the ranks `distlab.launch` starts (under torchrun the world is torchrun's)."""
    p.add_argument("--world-size", type=positive_int, nargs=nargs, default=default, metavar="N", help=help)


def add_seed(p: argparse.ArgumentParser, help: str, default: int = 0) -> None:
    """--seed S: the seed of the weights and the data."""
    p.add_argument("--seed", type=non_negative_int, default=default, help=help)


def add_dtype(p: argparse.ArgumentParser, default: str, help: str,
              choices: Sequence[str] = ("float64", "float32")) -> None:
    """--dtype NAME, one of `choices` (names of `DTYPES`); `DTYPES[args.dtype]` is the torch dtype."""
    unknown = [c for c in choices if c not in DTYPES]
    if unknown or default not in choices:
        raise ValueError(f"choices={list(choices)}, default={default!r}: use names of DTYPES "
                         f"({', '.join(DTYPES)}) and a default among the choices")
    p.add_argument("--dtype", choices=list(choices), default=default, help=help)


def add_steps(p: argparse.ArgumentParser, default: int, help: str) -> None:
    """--steps K: training steps (or gradients, or timed steps: the help says which)."""
    p.add_argument("--steps", type=positive_int, default=default, help=help)


def add_json(p: argparse.ArgumentParser, help: str = "print the report as JSON") -> None:
    """--json: print data, not text."""
    p.add_argument("--json", action="store_true", help=help)


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
