"""Every entry point (`python -m distlab.<chapter>`) uses the option names CONTRIBUTING promises.

CONTRIBUTING: "--world-size N starts N ranks ..., --seed, --dtype, --steps, --json where it prints data.
Every option has a help text that shows its default, and a bad value gets argparse's usage error, not a
traceback." Each chapter's `__main__` exposes `parser()`; the tests build it in this process (no rank
starts) and read its options, its `--help`, and what it says to a bad value.
"""

from __future__ import annotations

import argparse
import importlib

import pytest

from distlab import chapters, cli_types

ENTRY_POINTS = chapters.modules()  # every chapter's python -m distlab.<name>, from the one chapter table
# the entry points that take their common options from distlab.cli_types (plan and memory adopt it later)
ON_CLI_TYPES = [e for e in ENTRY_POINTS if e not in ("plan", "memory")]
PROMISED = {"world_size": "--world-size", "seed": "--seed", "dtype": "--dtype", "steps": "--steps",
            "json": "--json"}
SYNONYMS = {"--world_size", "--nproc", "--nprocs", "--np", "--num-ranks", "--ranks", "--world", "--workers",
            "--random-seed", "--rng-seed", "--num-steps", "--n-steps", "--iterations-total",
            "--as-json", "--output-json"}


def _parsers(name: str) -> list[argparse.ArgumentParser]:
    """The entry point's parser and its sub-command parsers (memory has `measure` and `estimate`)."""
    top = importlib.import_module(f"distlab.{name}.__main__").parser()
    subs = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return [top, *(p for action in subs for p in action.choices.values())]


def _command_of(name: str, dest: str) -> list[str]:
    """The sub-command whose parser holds option `dest` (`["heal"]`), or [] when the top parser does."""
    top = importlib.import_module(f"distlab.{name}.__main__").parser()
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                if any(a.dest == dest for a in sub._actions):
                    return [command]
    return []


def _options(name: str) -> list[argparse.Action]:
    return [a for p in _parsers(name) for a in p._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_common_options_have_the_promised_names(name: str) -> None:
    for action in _options(name):
        if action.dest in PROMISED:
            assert action.option_strings == [PROMISED[action.dest]], (name, action.option_strings)
        assert not set(action.option_strings) & SYNONYMS, (name, action.option_strings)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_help_shows_every_default(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    for p in _parsers(name):
        assert issubclass(p.formatter_class, argparse.ArgumentDefaultsHelpFormatter), (name, p.prog)
    for action in _options(name):
        assert action.help and action.help != argparse.SUPPRESS, (name, action.option_strings)
    with pytest.raises(SystemExit) as done:
        _parsers(name)[0].parse_args(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out + "".join(p.format_help() for p in _parsers(name)[1:])
    assert shown.count("(default:") >= len(_options(name)), name


@pytest.mark.parametrize("name", ON_CLI_TYPES)
def test_common_options_read_their_values_the_same_way(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    options = {a.dest: a for a in _options(name)}
    types = {"world_size": cli_types.positive_int, "steps": cli_types.positive_int,
             "seed": cli_types.non_negative_int}
    for dest, kind in types.items():
        if dest in options:
            assert options[dest].type is kind, (name, dest)
    if "dtype" in options:
        assert set(options["dtype"].choices) <= set(cli_types.DTYPES) | {"int32", "int64"}, name
    if "json" in options:
        assert isinstance(options["json"], argparse._StoreTrueAction), name
    for dest, bad, message in (("world_size", "0", "argument --world-size: 0 must be at least 1"),
                               ("steps", "zero", "argument --steps: 'zero' is not a whole number"),
                               ("seed", "-1", "argument --seed: -1 must be at least 0")):
        if dest in options:
            with pytest.raises(SystemExit) as done:
                _parsers(name)[0].parse_args([*_command_of(name, dest), PROMISED[dest], bad])
            assert done.value.code == 2
            err = capsys.readouterr().err
            assert err.startswith("usage:") and message in err, (name, err)


def test_the_one_dtype_table_and_sizes() -> None:
    assert list(cli_types.DTYPES) == ["float64", "float32", "float16", "bfloat16"]
    assert [cli_types.size(t) for t in ("4096", "64K", "4M", "1G", "1e6")] == [4096, 65536, 4 << 20, 1 << 30,
                                                                               10**6]
    for bad in ("0", "4X", "-1", "1.5", "K"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{bad!r} is not a size such as 4096, 64K"):
            cli_types.size(bad)
    with pytest.raises(ValueError, match=r"choices=\['float64', 'int8'\], default='float64': use names of"):
        cli_types.add_dtype(argparse.ArgumentParser(), "float64", "x", choices=("float64", "int8"))
