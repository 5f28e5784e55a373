"""Distributed Muon's single-process pieces: Muon's update against torch.optim.Muon's own, the owners,
the parameter split, the flat layout's plan, the cost model and the errors (no processes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim._muon import _zeropower_via_newtonschulz

from distlab.memory.muon import cost_model as cm
from distlab.memory.muon.common import check_parameters
from distlab.memory.muon.flat_layout import FlatLayout, elements
from distlab.memory.muon.newton_schulz import (
    MuonSettings,
    adjusted_lr,
    muon_matrix_step_,
    newton_schulz_flops,
    zeropower_via_newtonschulz,
)
from distlab.memory.muon.owners import greedy_owners, imbalance, loads
from distlab.memory.muon.split import split_parameters
from distlab.memory.zero import ShardedOptimizer


@pytest.mark.parametrize("shape", [(5, 9), (9, 5), (6, 6)])
def test_newton_schulz_is_torchs_bit_for_bit(shape):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ours = zeropower_via_newtonschulz(g)
    theirs = _zeropower_via_newtonschulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("nesterov,adjust", [(True, None), (False, "match_rms_adamw"), (True, "original")])
def test_one_matrix_three_steps_equal_torch_optim_muon(nesterov, adjust):
    s = MuonSettings(lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    ref = nn.Parameter(w.clone())
    opt = torch.optim.Muon([ref], **s.muon_kwargs())
    ours, buf = w.clone(), torch.zeros_like(w)
    for _ in range(3):
        g = torch.randn(7, 4, generator=gen, dtype=torch.float64)
        ref.grad = g.clone()
        opt.step()
        muon_matrix_step_(ours, g, buf, s)
    assert torch.equal(ours, ref.detach())
    assert torch.equal(buf, opt.state[ref]["momentum_buffer"])


def test_adjusted_lr_and_flops():
    assert adjusted_lr(0.1, None, (8, 2)) == pytest.approx(0.2)  # sqrt(max(1, 8 / 2)) = 2
    assert adjusted_lr(0.1, "original", (2, 8)) == pytest.approx(0.1)
    assert adjusted_lr(0.1, "match_rms_adamw", (4, 9)) == pytest.approx(0.1 * 0.2 * 3)
    with pytest.raises(ValueError, match="adjust_lr_fn='rms'.*'match_rms_adamw'"):
        adjusted_lr(0.1, "rms", (2, 2))
    # m = 2, n = 3: per iteration 4 * 4 * 3 + 2 * 8 = 64, five iterations; orientation does not matter
    assert newton_schulz_flops((2, 3)) == newton_schulz_flops((3, 2)) == 320


def test_greedy_owners_balance_largest_first_and_leave_extra_ranks_idle():
    assert greedy_owners([5, 3, 3, 2, 1], 2) == [0, 1, 1, 0, 1]  # 5+2 = 7 against 3+3+1 = 7
    assert loads([5, 3, 3, 2, 1], [0, 1, 1, 0, 1], 2) == [7, 7]
    assert imbalance([5, 3, 3, 2, 1], [0, 1, 1, 0, 0], 2) == pytest.approx(8 / 7)  # 1 on rank 0
    assert greedy_owners([4, 4], 4) == [0, 1]  # more ranks than matrices: ranks 2 and 3 own nothing
    with pytest.raises(ValueError, match="owner 5 is not a rank of 2"):
        loads([1.0], [5], 2)
    with pytest.raises(ValueError, match="world=0"):
        greedy_owners([1.0], 0)


def test_split_gives_linear_weights_to_muon_and_the_rest_to_adamw():
    from distlab.memory.muon.parity import muon_task

    muon, adamw = split_parameters(muon_task("gpt").build(0))
    assert all(p.ndim == 2 for _, p in muon) and len(muon) == 4
    assert {n for n, _ in adamw} >= {"wte.weight", "wpe.weight", "ln_f.weight"}  # tied head = embedding
    head = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5))
    muon, adamw = split_parameters(head, head=("1.weight",))
    assert [n for n, _ in muon] == ["0.weight"] and [n for n, _ in adamw] == ["0.bias", "1.weight", "1.bias"]


def test_bad_parameters_are_named():
    w, b = nn.Parameter(torch.zeros(2, 3)), nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="parameter 'b' has shape \\(3,\\).*give it to AdamW"):
        check_parameters([("b", b)], [])
    with pytest.raises(ValueError, match="parameter 'w2' is given twice \\(also as 'w'\\)"):
        check_parameters([("w", w)], [("w2", w)])
    with pytest.raises(ValueError, match="several dtypes"):
        check_parameters([("w", w)], [("b", nn.Parameter(torch.zeros(3, dtype=torch.float64)))])


def test_sharded_optimizer_refuses_muon_and_points_to_the_section():
    with pytest.raises(ValueError, match="optimizer_class=Muon orthogonalises each whole weight matrix.*"
                                         "OwnerMuon or AllToAllMuon.*sec-distributed-muon"):
        ShardedOptimizer([nn.Parameter(torch.zeros(2, 2))], torch.optim.Muon, lr=0.1)


def test_the_flat_plan_moves_every_matrix_element_once():
    shapes = ((3, 5), (4, 4), (2, 7), (6, 1), (5, 3))
    for world in (1, 2, 3, 4, 7):
        lay = FlatLayout(tuple(a * b for a, b in shapes) + (9, 4), world)
        owners = greedy_owners([newton_schulz_flops(s) for s in shapes], world)
        sent = sum(elements(p) for r in range(world) for p in lay.sends(r, range(5), owners))
        got = sum(elements(p) for q in range(world) for p in lay.receives(q, range(5), owners))
        assert sent == got == sum(a * b for a, b in shapes)


def test_gpt2_small_counts_and_the_state_table():
    model = cm.gpt_model(12, 768, 50257, 1024)
    assert sum(model.numels) == 124_439_808  # GPT-2 small with the head tied to the embedding
    assert sum(a * b for a, b in model.matrices) == 12 * 12 * 768 ** 2
    for world in (4, 8):
        a2a = [cm.state_bytes("all_to_all", model, world, r, 4) for r in range(world)]
        zero1 = [cm.state_bytes("zero1_adamw", model, world, r, 4) for r in range(world)]
        owner = [cm.state_bytes("owner", model, world, r, 4) for r in range(world)]
        m, a = 12 * 12 * 768 ** 2, sum(model.others)
        assert sum(a2a) == sum(owner) == (m + 2 * a) * 4  # one momentum, or two moments, per element
        assert sum(zero1) == 2 * (m + a) * 4
        assert max(a2a) <= max(zero1) < max(owner)  # the embedding's moments land whole on one owner
    with pytest.raises(ValueError, match="layout='zero3'"):
        cm.state_bytes("zero3", model, 4, 0, 4)


def test_the_owner_exercise_passes_the_greedy_rule_and_names_each_mistake():
    from distlab.memory.muon.exercises import check_owners

    assert check_owners(lambda shapes, world: greedy_owners([newton_schulz_flops(s) for s in shapes], world))
    round_robin = check_owners(lambda shapes, world: [i % world for i in range(len(shapes))])
    assert not round_robin and "round robin" in str(round_robin)
    by_elements = check_owners(lambda shapes, world: greedy_owners([a * b for a, b in shapes], world))
    assert not by_elements and "balanced the matrices' elements" in str(by_elements)
    assert "outside 0 .. 2" in str(check_owners(lambda shapes, world: [world] * len(shapes)))

    def stub(shapes, world):
        raise NotImplementedError

    assert check_owners(stub).not_written


def test_preconditioner_table_counts_and_the_book_shows_the_codes_table():
    from pathlib import Path

    from distlab.memory.muon import preconditioners as pc

    assert pc.blocks((3072, 768), 1024) == [(1024, 768)] * 3
    assert pc.state_values("Shampoo", (4, 4), 8) == 2 * (16 + 16)  # L, R and their inverse roots
    assert pc.state_values("SOAP", (4, 2), 8) == 2 * (16 + 4) + 2 * 8  # L, R, Q_L, Q_R and Adam's moments
    with pytest.raises(ValueError, match="optimizer='Lion'"):
        pc.state_values("Lion", (4, 4), 8)
    book = (Path(__file__).resolve().parents[3] / "book" / "07-memory.md").read_text()
    gpt2 = cm.gpt_model(12, 768, 50257, 1024)
    assert pc.markdown_table(gpt2, 8, 1024) in book
    from distlab.memory.muon import tables

    assert tables.bytes_table(gpt2, (4, 8)) in book and tables.memory_table(gpt2, (4, 8)) in book


def test_the_layout_figure_says_all_to_all_never_loses_in_the_model():
    from distlab.memory.muon.figures import WIDTHS, WORLDS, layout_ratio, layouts_figure

    ratios = [layout_ratio(w, n) for w in WIDTHS[:2] for n in WORLDS[:3]]
    assert all(r > 1 for r in ratios)
    assert layouts_figure().axes  # drawn
