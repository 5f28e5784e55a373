"""Chapter 7's peak of one MoE training step (`estimate.moe_step_peak`) against the step measured on
gloo ranks (`measure.moe_step`): chapter 6's folded block on 1-4 ranks, tp 1/2, ep 1/2/3/4, top-1 and
top-2, a capacity factor that drops tokens, fp32 and bf16, Adam's for-loop, foreach and fused forms, the
first step (Adam's state made inside it) and a later one; peaks that fall in forward, backward and the
optimizer's step. The goal is 1 %; the model follows every tensor of the step, so it is in fact within a
few bytes, and the test says so when it is not. Then the timeline's order, without processes."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from distlab import launch
from distlab.memory.estimate.moe_block_activations import BlockShape, balanced_rows, block_saved_bytes
from distlab.memory.estimate.moe_step_ops import RankRows
from distlab.memory.estimate.moe_step_peak import block_parameter_sizes, predict_moe_step_peak
from distlab.memory.measure.moe_step import GRID, MoEStepCase, compare

CASES = GRID


def _measure(world: int) -> list[dict]:
    from distlab.memory.measure.moe_step import measure_cases

    return measure_cases([*CASES[world], CASES[world][0]])  # the first case again: the same peak, to the byte


def _book_rows() -> dict[str, tuple[int, int, int]]:
    """Chapter 6's table (`python -m distlab.memory.measure.moe_step`): case -> (rank, predicted,
    measured)."""
    text = (Path(__file__).parents[3] / "book" / "06-moe.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[1].isdigit():
            rows[cells[0]] = (int(cells[1]), int(cells[2].replace(",", "")), int(cells[3].replace(",", "")))
    return rows


def shape_of(case: MoEStepCase) -> BlockShape:
    return BlockShape(case.batch, case.seq, case.hidden, case.heads, case.ffn, case.experts, case.k,
                      case.tp, case.ep, e=2 if case.dtype == "bfloat16" else 4)


@pytest.mark.ranks
@pytest.mark.parametrize("world", sorted(CASES))
def test_predicted_peak_within_1_percent_of_the_measured_step_on_every_rank(world: int) -> None:
    ranks = launch.run(_measure, world, world, timeout=240)
    phases, dropped = set(), False
    book = _book_rows()
    for i, case in enumerate(CASES[world]):
        rows_of_case = compare(case, [r[i] for r in ranks])
        top = max(rows_of_case, key=lambda row: row["predicted"])  # as the table: the same rank every run
        got = (top["rank"], top["predicted"], top["measured"])
        # The prediction is arithmetic on the routing: the book's number exactly. The measurement is
        # the book's within the 1 % the chapter claims (a slow machine may see gloo's worker let go of
        # a finished collective's buffer after the settle pause; see memory.measure.moe_step).
        assert book[case.label()][:2] == got[:2], f"refresh chapter 6's table: {case.label()} gives {got}"
        assert abs(book[case.label()][2] - got[2]) <= 0.01 * got[2], (case.label(), book[case.label()], got)
        for row in rows_of_case:
            where = (case.label(), row["rank"], row["predicted"], row["measured"], row["phase"], row["where"])
            assert abs(row["predicted"] - row["measured"]) <= 0.01 * row["measured"], where
            assert row["phase"] == row["measured_phase"], where
            if row["phase"] != "optimizer":  # the op that made the peak: the same tensor's bytes
                assert row["peak_tensor_bytes"] == row["peak_op_bytes"], (where, row)
            rows = row["rows"]
            dropped |= rows.sent < balanced_rows(shape_of(case), rows.tp_rank)[0]
            phases.add(row["phase"])
    for r in ranks:  # the first case measured again: the same peak (to the byte on a quiet machine)
        again, first = r[-1]["memory"].peak_bytes, r[0]["memory"].peak_bytes
        assert abs(again - first) <= 0.01 * first, (r[0]["rank"], first, again)
    covered = {1: {"backward", "optimizer"}, 2: {"forward", "optimizer"}, 3: {"forward", "backward"},
               4: {"forward", "optimizer"}}
    assert phases == covered[world], f"the grid's peaks moved to other phases: {phases}"
    if world >= 2:
        assert dropped, "capacity 1.0 should drop tokens in this world's cases"


def test_the_grid_covers_what_the_issue_asks() -> None:
    cases = [c for world in CASES.values() for c in world]
    assert set(_book_rows()) == {c.label() for c in cases}  # chapter 6's table shows every case
    assert {c.world for c in cases} == {1, 2, 3, 4}
    assert {c.tp for c in cases} == {1, 2} and {1, 2, 4} <= {c.ep for c in cases}
    assert {c.k for c in cases} == {1, 2} and {c.dtype for c in cases} == {"float32", "bfloat16"}
    assert {c.adam for c in cases} == {"for-loop", "foreach", "fused"}
    assert {c.first_step for c in cases} == {True, False}
    assert 1.0 in {c.capacity_factor for c in cases} and len(cases) >= 8


# ------------------------------------------------------------------------- the timeline, without processes

S = BlockShape(batch=4, seq=16, hidden=16, heads=4, ffn=32, experts=8, top_k=2, tp=2, ep=2, e=4)
ROWS = RankRows(tp_rank=1, sent=56, received=(14, 12, 13, 16))


def _first(tl_names: list[str], prefix: str) -> int:
    return next(i for i, n in enumerate(tl_names) if n.startswith(prefix))


def _trace(monkeypatch, s: BlockShape, rows: RankRows, first_step: bool = False) -> list:
    """Every allocation of the predicted step, in order: (phase, name, kind, bytes)."""
    from distlab.memory.estimate.timeline import Timeline

    peak = importlib.import_module("distlab.memory.estimate.moe_step_peak")

    events: list[tuple[str, str, str, int]] = []

    class Recording(Timeline):
        def alloc(self, name: str, nbytes: float, kind: str = "temporaries") -> None:
            super().alloc(name, nbytes, kind)
            events.append((self.phase, name, kind, int(nbytes)))

    with monkeypatch.context() as m:
        m.setattr(peak, "Timeline", Recording)
        predict_moe_step_peak(s, rows, first_step=first_step)
    return events


def test_forward_leaves_exactly_the_saved_activations_but_the_batch() -> None:
    """At the end of forward the activations alive are `block_terms`, less the batch x (the caller's)."""
    from distlab.memory.estimate.moe_step_backward import backward
    from distlab.memory.estimate.moe_step_ops import Widths, forward
    from distlab.memory.estimate.timeline import Timeline

    tl = Timeline()
    forward(tl, S, ROWS)
    alive = sum(n for kind, n in tl.alive.values() if kind == "activations")
    x = S.tokens * S.hidden * S.e
    assert alive == block_saved_bytes(S, ROWS.sent, ROWS.received, ROWS.tp_rank) - x
    backward(tl, Widths(S, ROWS))  # and backward frees every one of them, leaving the gradients
    assert not [n for n, (kind, _) in tl.alive.items() if kind != "grads"]
    assert sum(n for _, n in tl.alive.values()) == S.e * sum(block_parameter_sizes(S))


def test_backward_runs_the_experts_last_first_and_attention_after_the_router(monkeypatch) -> None:
    events = _trace(monkeypatch, S, ROWS)
    names = [name for phase, name, kind, _ in events if phase == "backward" and kind == "grads"]
    experts = [n for n in names if n.startswith("g.e") and n.endswith("w_out")]
    assert experts == [f"g.e{j}.w_out" for j in (3, 2, 1, 0)]
    assert _first(names, "g.e") < _first(names, "g.router") < _first(names, "g.ln_2") \
        < _first(names, "g.attn.c_proj") < _first(names, "g.attn.c_attn") < _first(names, "g.ln_1")


def test_adam_state_appears_in_the_first_steps_optimizer_and_before_forward_later(monkeypatch) -> None:
    events = _trace(monkeypatch, S, ROWS, first_step=True)
    first = [(p, kind) for p, _, kind, _ in events if kind == "optimizer"]
    later = [(p, kind) for p, _, kind, _ in _trace(monkeypatch, S, ROWS) if kind == "optimizer"]
    assert first == [("optimizer", "optimizer")] and later == [("forward", "optimizer")]


def test_the_sum_of_parts_overestimates_a_step_whose_activations_outweigh_its_scratch() -> None:
    """Model states + every saved activation never coexist: the gradients come as the activations go."""
    p = predict_moe_step_peak(S, ROWS)
    assert p.sum_of_parts_bytes > p.peak_bytes
    assert p.phase == "forward" and p.parts["grads"] == 0


def test_parameter_sizes_are_the_model_states_count() -> None:
    from distlab.memory.estimate.moe_states import layer_params
    from tests.memory.estimate.test_moe_states import _block_shape

    for tp, ep in ((1, 1), (2, 2), (2, 4), (4, 2)):
        s = BlockShape(2, 6, 16, 4, 24, 8, 2, tp=tp, ep=ep)
        assert sum(block_parameter_sizes(s)) == sum(layer_params(_block_shape(), True, tp, ep, 1))


def test_bad_inputs_name_the_fix() -> None:
    with pytest.raises(ValueError, match="adam='sgd' is unknown"):
        predict_moe_step_peak(S, ROWS, adam="sgd")
    with pytest.raises(ValueError, match="one count per local expert"):
        predict_moe_step_peak(S, RankRows(0, 10, (1, 2)))
    with pytest.raises(ValueError, match="outside the tp group"):
        predict_moe_step_peak(S, RankRows(2, 10, (1, 2, 3, 4)))
