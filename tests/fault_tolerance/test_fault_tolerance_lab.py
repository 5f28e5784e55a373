"""Lab 11 without torchft (an optional extra, Linux only): its torchft cells say what they would have shown
and how to install it, and the lab goes on (issue 34, cause 3: ModuleNotFoundError, then "TypeError:
'ReferenceRun' object is not iterable" when part 4 reused part 2's `survivors`). The cells are the lab's
own, run in one namespace with torchft hidden."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from distlab.fault_tolerance.torchft_compare import TORCHFT_INSTALL, torchft_missing

LAB = Path(__file__).resolve().parents[2] / "labs" / "11_fault_tolerance.ipynb"


def _code_cells() -> tuple[str, list[str]]:
    """The lab's first code cell (its imports) and the code cells of part 4, in order."""
    cells = json.loads(LAB.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    start = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## 4 ·"))
    part4 = [c for c in cells[start:] if c["cell_type"] == "code"]
    return "".join(code[0]["source"]), ["".join(c["source"]) for c in part4]


def test_part_4_without_torchft_says_what_it_would_show_and_goes_on(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "torchft", None)  # `import torchft` now fails, as where it is missing
    assert torchft_missing("show it") is not None
    imports, part4 = _code_cells()
    namespace: dict = {"__name__": "lab11"}
    exec(compile(imports, "lab 11, imports", "exec"), namespace)
    namespace["survivors"] = object()  # part 2's run, which part 4 once reused by mistake
    for i, source in enumerate(part4):
        exec(compile(source, f"lab 11, part 4 cell {i}", "exec"), namespace)
    out = capsys.readouterr().out
    assert out.count("torchft is not installed, so this cell skips its part.") == 2, out
    assert out.count(f"To see it: {TORCHFT_INSTALL}") == 2, out
    assert "agrees within 1e-10" in out and "the attempt it did not commit" in out  # what it would show
    assert "your guesses: None attempt(s), None s" in out  # the cells after them ran
    assert "lab 11 (fault tolerance): " in out  # and so did the progress cell at the end


def test_torchft_missing_is_silent_where_torchft_is_installed() -> None:
    pytest.importorskip("torchft")
    assert torchft_missing("show it") is None


def _outer(sign: float = 1.0, plain: bool = False, scale: str = "mean"):  # type: ignore[no-untyped-def]
    """An outer step, right by default, or with one of the usual mistakes."""
    import torch

    def step(theta, thetas, buffer, lr, mu):  # type: ignore[no-untyped-def]
        reduce = torch.stack([theta - t for t in thetas])
        delta = sign * (reduce.mean(0) if scale == "mean" else reduce.sum(0))
        b = delta if buffer is None else mu * buffer + delta
        return theta - lr * (b if plain else delta + mu * b), b
    return step


def test_the_outer_step_check_passes_diloco_and_names_each_mistake() -> None:
    """Lab 11's part-3 exercise: DiLoCo's outer step (Douillard et al. 2023) against `OuterNesterov`."""
    import torch

    from distlab.fault_tolerance.exercises import check_outer_step, outer_step_reference

    assert check_outer_step(_outer()).passed
    for mistake, words in ((_outer(sign=-1.0), "not theta_r - theta"),
                           (_outer(plain=True), "not by the buffer b alone"),
                           (_outer(scale="sum"), "averaged (divide by R), not summed"),
                           (lambda th, ths, b, lr, mu: (torch.stack(ths).mean(0), b), "the replicas' mean")):
        report = check_outer_step(mistake)
        assert not report.passed and words in str(report), str(report)

    def stub(*args):  # type: ignore[no-untyped-def]
        raise NotImplementedError("Your turn")

    assert check_outer_step(stub).not_written
    # outer lr 1 without momentum: the new theta is the replicas' mean (DiLoCo is local SGD there)
    theta, thetas = torch.zeros(3, dtype=torch.float64), [torch.ones(3, dtype=torch.float64),
                                                           torch.full((3,), 3.0, dtype=torch.float64)]
    new, _ = outer_step_reference(theta, thetas, None, 1.0, 0.0)
    assert torch.equal(new, torch.full((3,), 2.0, dtype=torch.float64))
