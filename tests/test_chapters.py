"""The one chapter table (`distlab.chapters`): README, CONTRIBUTING and `distlab --help` agree with it, it
agrees with the tree, and every chapter, 0 to 12, has an entry point that answers `--help` (issue 36 item 4;
issue 38 D2, D3, D11, D12)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from distlab import chapters, cli
from distlab.fault_tolerance import __main__ as ft_main
from distlab.fault_tolerance import goodput

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("file, name, render", chapters.GENERATED, ids=[g[1] for g in chapters.GENERATED])
def test_readme_and_contributing_print_the_chapter_table(file: str, name: str, render) -> None:
    text = (ROOT / file).read_text()
    assert chapters.rewrite(text, name, render()) == text, \
        f"{file}'s {name} table differs from src/distlab/chapters.py: run python tools/chapter_tables.py"


def test_a_stale_table_is_found_and_a_missing_marker_named() -> None:
    text = (ROOT / "README.md").read_text()
    old = text.replace("| 11 | Training that survives", "| 11 | Training that fails", 1)
    assert chapters.rewrite(old, "chapters", chapters.readme_chapters()) == text
    with pytest.raises(ValueError, match=r"no line '<!-- chapters.py: packages"):
        chapters.rewrite(text, "packages", chapters.contributing_packages())


def test_the_table_is_the_tree() -> None:
    assert [c.number for c in chapters.CHAPTERS] == list(range(14))
    toc = (ROOT / "_toc.yml").read_text()
    for c in chapters.CHAPTERS:
        assert (ROOT / c.lab).is_file() and (ROOT / c.book).is_file(), c
        assert f"file: {c.book.removesuffix('.md')}" in toc and f"file: {c.lab.removesuffix('.ipynb')}" in toc
        assert c.lab.startswith(f"labs/{c.label}_") and c.book.startswith(f"book/{c.label}-")
        for package in c.packages:
            assert (ROOT / "src" / "distlab" / package).is_dir(), (c.number, package)
        assert c.entry_points, f"chapter {c.number} has no entry point"
    for name in chapters.modules():
        main = importlib.import_module(f"distlab.{name}.__main__")
        assert callable(main.parser) and callable(main.main), name
    repo_map = next(line for line in (ROOT / "README.md").read_text().splitlines()
                    if line.startswith("| `src/distlab/` |"))
    for c in chapters.CHAPTERS[1:]:
        for package in c.packages:
            assert f"`{package}/`" in repo_map, f"README's repository map omits {package}/ ({c.number})"


def test_distlab_help_lists_every_chapters_command() -> None:
    out = subprocess.run([sys.executable, "-m", "distlab", "--help"], capture_output=True, text=True,
                         check=True).stdout
    flat = " ".join(out.split())
    for c in chapters.CHAPTERS:
        for e in c.entry_points:
            assert f"{e.command} chapter {c.number}:" in flat, f"`distlab --help` lacks chapter {c.number}"
        assert f"  {c.label}  {', '.join(e.command for e in c.entry_points)}" in out
    assert [command for command, _, _ in cli.CHAPTERS] == chapters.modules()


def test_bare_python_m_distlab_prints_the_commands_and_exits_0() -> None:
    # It used to exit 2 with only "the following arguments are required: COMMAND".
    done = subprocess.run([sys.executable, "-m", "distlab"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: distlab") and "chapters and their commands:" in done.stdout
    assert "fault_tolerance" in done.stdout and "dryrun" in done.stdout


@pytest.mark.parametrize("command", ["dryrun", "fault_tolerance"])
def test_distlab_chapter_11_and_12_commands_answer_help(command: str, capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    # `distlab dryrun` was "invalid choice"; chapter 11 had no entry point at all.
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0 and f"python -m distlab.{command}" in capsys.readouterr().out


def test_python_m_distlab_fault_tolerance_help() -> None:
    done = subprocess.run([sys.executable, "-m", "distlab.fault_tolerance", "--help"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "heal" in done.stdout and "goodput" in done.stdout, done.stderr


def test_fault_tolerance_goodput_is_the_chapters_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert ft_main.main(["goodput", "--failures-per-day", "20", "--replicas", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    mtbf = goodput.mtbf_from_rate(20)
    assert out["checkpoint_restart"] == goodput.checkpoint_goodput(mtbf, 2.0, 60.0, 300.0)
    assert out["healing"] == goodput.healing_goodput(mtbf, 2.0, 1.0, 10.0, 8, 300.0)
    assert ft_main.main(["goodput"]) == 0
    text = capsys.readouterr().out
    assert "checkpoint-restart:" in text and "8 replicas that heal:" in text


@pytest.mark.parametrize("argv, message", [
    (["heal", "--kill", "2"], "argument --kill: '2' is not REPLICA:STEP such as 2:2, or none"),
    (["heal", "--replicas", "3"], r"join=(3, 4) must be (replica, step) with a replica from 0 to 2"),
    (["goodput", "--replicas", "1"], "argument --replicas: 1 must be at least 2"),
])
def test_fault_tolerance_bad_input_names_the_option(argv: list[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        ft_main.main(argv)
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_fault_tolerance_heal_kills_one_and_matches_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    status = ft_main.main(["heal", "--replicas", "3", "--per-replica", "4", "--steps", "4", "--kill", "2:2",
                           "--join", "none", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0 and out["passed"], out["verdicts"]
    assert out["members"] == [[0, 1, 2], [0, 1, 2], [0, 1], [0, 1]] and out["redone_rounds"] == [2]
    assert "SIGKILLed at step 2 as asked" in out["ended"]["2"]
    assert out["verdicts"][0].endswith(": ok") and "one process on the quorums' data" in out["verdicts"][0]
