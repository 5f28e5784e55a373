"""The set-up files agree with each other: pyproject.toml and environment.yml list the same packages with
the same pins, and every chapter and lab is in the book's table of contents.

These checks are cheap and run without starting any rank.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # a dependency of jupyter-book
from packaging.requirements import Requirement  # a dependency of pytest
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
NOT_PACKAGES = {"python", "pip"}  # environment.yml entries that set up conda itself


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _environment() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))


def _by_name(specs: list[str]) -> dict[str, Requirement]:
    """Parse requirement strings (PEP 508; conda's `name>=x,<y` is the same syntax) keyed by name."""
    out: dict[str, Requirement] = {}
    for spec in specs:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name not in out, f"{name} is listed twice: {out[name]} and {req}"
        out[name] = req
    return out


def _environment_specs() -> tuple[list[str], list[str], str | None]:
    """(conda package specs, pip specs, the python spec) from environment.yml."""
    conda, pip, python = [], [], None
    for entry in _environment()["dependencies"]:
        if isinstance(entry, dict):
            pip.extend(entry.get("pip", []))
        elif Requirement(entry).name == "python":
            python = entry
        elif Requirement(entry).name not in NOT_PACKAGES:
            conda.append(entry)
    return conda, pip, python


def _toc_files() -> list[str]:
    """Every `file:` in _toc.yml, in order, at any depth."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                found.append(str(node["file"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    found.append(str(toc["root"]))
    walk(toc.get("parts", toc.get("chapters", [])))
    return found


# --------------------------------------------------------------------------------------------------
# pyproject.toml <-> environment.yml
# --------------------------------------------------------------------------------------------------

def test_environment_lists_the_same_packages_with_the_same_pins() -> None:
    project = _pyproject()["project"]
    extras = [spec for extra in project["optional-dependencies"].values() for spec in extra]  # gpu, torchft
    wanted = _by_name(project["dependencies"] + extras)
    conda, pip, _ = _environment_specs()
    have = _by_name(conda + [spec for spec in pip if not spec.startswith("-e")])
    missing = sorted(set(wanted) - set(have))
    extra = sorted(set(have) - set(wanted))
    assert not missing, f"environment.yml lacks {missing}, which pyproject.toml requires: add them"
    assert not extra, f"environment.yml has {extra}, which pyproject.toml does not list: add or remove them"
    for name, req in wanted.items():
        assert have[name].specifier == req.specifier, (
            f"{name}: pyproject.toml pins {str(req.specifier) or 'nothing'} but environment.yml pins "
            f"{str(have[name].specifier) or 'nothing'}; make them equal")


def test_torch_is_pinned_to_the_same_release_everywhere() -> None:
    wanted = _by_name(_pyproject()["project"]["dependencies"])["torch"]
    assert str(wanted.specifier) == "==2.13.0", (
        f"pyproject.toml pins torch{wanted.specifier}, expected ==2.13.0")
    _, pip, _ = _environment_specs()
    assert "torch==2.13.0" in pip, (
        f"environment.yml must install torch==2.13.0 with pip; its pip list is {pip}")


def test_nccl_wheel_is_the_gpu_extra_and_in_the_conda_environment() -> None:
    gpu = _by_name(_pyproject()["project"]["optional-dependencies"]["gpu"])
    assert "nvidia-nccl-cu12" in gpu, (
        f"pyproject.toml's gpu extra must hold nvidia-nccl-cu12, it has {list(gpu)}")
    marker = gpu["nvidia-nccl-cu12"].marker
    assert marker is not None and "linux" in str(marker), (
        f"the nvidia-nccl-cu12 wheel exists for Linux only; its marker is {marker}, "
        "expected sys_platform == 'linux'")
    _, pip, _ = _environment_specs()
    assert any(Requirement(s).name == "nvidia-nccl-cu12" for s in pip if not s.startswith("-e")), (
        "environment.yml (for GPU nodes) must pip-install nvidia-nccl-cu12")


def test_environment_installs_distlab_itself_and_the_right_python() -> None:
    _, pip, python = _environment_specs()
    assert "-e ." in pip, (
        f"environment.yml must end its pip list with '-e .' to install distlab; it has {pip}")
    requires = _pyproject()["project"]["requires-python"]
    assert python is not None, "environment.yml must pin python, like pyproject.toml's requires-python"
    assert Requirement(python).specifier == Requirement(f"python{requires}").specifier, (
        f"environment.yml has {python}, pyproject.toml requires-python is {requires}: make them equal")


# --------------------------------------------------------------------------------------------------
# chapters, labs and the table of contents
# --------------------------------------------------------------------------------------------------

CHAPTER = re.compile(r"^(\d\d)-[a-z0-9-]+$")
LAB = re.compile(r"^(\d\d)_[a-z0-9_]+$")


def test_every_book_chapter_is_in_the_toc() -> None:
    toc = set(_toc_files())
    chapters = sorted(p for p in (ROOT / "book").glob("*.md") if CHAPTER.match(p.stem))
    assert chapters, "book/ has no chapter files named NN-topic.md"
    missing = [f"book/{p.stem}" for p in chapters if f"book/{p.stem}" not in toc]
    assert not missing, f"{missing} are not in _toc.yml; add them under a part"


def test_every_lab_has_a_chapter_with_its_number_and_is_in_the_toc() -> None:
    toc = set(_toc_files())
    chapters = {CHAPTER.match(p.stem).group(1) for p in (ROOT / "book").glob("*.md") if CHAPTER.match(p.stem)}
    for lab in sorted((ROOT / "labs").glob("*.ipynb")):
        match = LAB.match(lab.stem)
        assert match, f"labs/{lab.name} should be named NN_topic.ipynb, NN the chapter number"
        assert match.group(1) in chapters, (
            f"labs/{lab.name} has no chapter book/{match.group(1)}-*.md; "
            "write the chapter or renumber the lab")
        assert f"labs/{lab.stem}" in toc, f"labs/{lab.stem} is not in _toc.yml; add it under its chapter"


def test_every_toc_entry_exists() -> None:
    for entry in _toc_files():
        candidates = [ROOT / f"{entry}{suffix}" for suffix in (".md", ".ipynb")]
        assert any(c.is_file() for c in candidates), (
            f"_toc.yml lists {entry}, but neither {entry}.md nor {entry}.ipynb exists")


def test_make_targets_and_ci_script_exist() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("lab", "test", "book", "lint", "clean"):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"Makefile has no '{target}' target"
    ci = ROOT / ".ci" / "run"
    assert ci.is_file() and ci.stat().st_mode & 0o111, ".ci/run must exist and be executable"
    assert "make test" in ci.read_text(encoding="utf-8"), ".ci/run must run 'make test'"


def test_code_and_labs_are_ruff_clean():
    """The style rules hold in CI, not only when someone runs `make lint`."""
    ruff = Path(sys.executable).with_name("ruff")
    out = subprocess.run([str(ruff), "check", "src", "tests", "labs"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
