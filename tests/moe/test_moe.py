"""Chapter 6: gating, capacity, the auxiliary losses, the reference layer, and expert parallelism.

Parity tests run in float64: the parallel layer and the reference add the same terms in a different
order, so they differ by a few ulps; 1e-10 separates that from a real bug by orders of magnitude.
Each world size is one launch that runs every case (starting ranks costs seconds); a hang would end
in the launcher's timeout (30 s), not a stuck test.
"""

from __future__ import annotations

import argparse
import math
from functools import partial

import pytest
import torch
from matplotlib.figure import Figure

from distlab import launch, mesh
from distlab.moe import (
    ExpertParallelMoE,
    MoELayer,
    Router,
    check_moe_config,
    cost_model,
    exercises,
    expert_capacity,
    load_balance,
    load_balancing_loss,
    router_z_loss,
    top_k_gating,
)
from distlab.moe import figures as moe_figures
from distlab.moe.gating import priority_positions
from distlab.moe.parity import ParityCase, expert_parallel_parity
from distlab.moe.traffic import measure_traffic

TOL = 1e-10


# --------------------------------------------------------------------------------------------------
# Capacity, top-k and dropping
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, experts, k, factor, want", [
    (12, 4, 1, 1.0, 3),      # Switch: T/E x capacity factor
    (12, 4, 2, 1.0, 6),      # GShard top-2: 2S/E
    (10, 4, 1, 1.25, 4),     # ceil(3.125)
    (100, 10, 1, 1.1, 11),   # 1.1 * 10 is 11.000000000000002 in floating point: still 11
    (8, 4, 1, 10.0, 8),      # never more than the tokens there are
    (0, 4, 2, 1.0, 0),
])
def test_expert_capacity(tokens, experts, k, factor, want):
    assert expert_capacity(tokens, experts, k, factor) == want


@pytest.mark.parametrize("args, message", [
    ((8, 9, 1.0), r"k=9 is larger than num_experts=8.*choose k <= 8"),
    ((8, 0, 1.0), r"k=0 must be a positive integer"),
    ((0, 1, 1.0), r"num_experts=0 must be a positive integer"),
    ((8, 1, 0.0), r"capacity_factor=0.0 must be a positive number"),
    ((8, 1, -1.5), r"capacity_factor=-1.5 must be a positive number"),
    ((8, 1, math.nan), r"capacity_factor=nan must be a positive number"),
    ((8, 1, 1.0, 3), r"num_experts=8 is not divisible by world_size=3.*multiple of 3 \(e.g. 6 or 9\)"),
])
def test_bad_configurations_name_the_value_and_the_fix(args, message):
    with pytest.raises(ValueError, match=message):
        check_moe_config(*args)


def test_layers_validate_at_construction():
    with pytest.raises(ValueError, match=r"k=5 is larger than num_experts=4"):
        MoELayer(4, 8, num_experts=4, k=5)
    with pytest.raises(ValueError, match=r"capacity_factor=0 must be a positive number"):
        MoELayer(4, 8, num_experts=4, capacity_factor=0)
    with pytest.raises(ValueError, match=r"group_sizes=\[2, 2\] must be non-negative and add up to the 5"):
        MoELayer(4, 8, 4)(torch.randn(5, 4), group_sizes=[2, 2])


def test_priority_is_first_choices_in_token_order_then_second_choices():
    # Token t's first choice is expert 0 for all tokens; second choices are 1, 1, 2, 0.
    index = torch.tensor([[0, 1], [0, 1], [0, 2], [1, 0]])
    pos = priority_positions(index, 3)
    # expert 0: tokens 0, 1, 2 (first choices) take slots 0-2, token 3's second choice slot 3.
    # expert 1: token 3's FIRST choice goes before tokens 0 and 1's second choices.
    assert pos.tolist() == [[0, 1], [1, 2], [2, 0], [0, 3]]


def test_top_k_gating_drops_in_order_and_zeroes_dropped_gates():
    logits = torch.tensor([[3.0, 0.0, 0.0]] * 4 + [[0.0, 3.0, 0.0]])
    r = top_k_gating(logits, k=1, capacity_factor=1.0)  # C = ceil(5/3) = 2
    assert r.capacity == 2
    assert r.kept[:, 0].tolist() == [True, True, False, False, True]
    assert r.gates[2:4].abs().sum() == 0
    assert r.tokens_per_expert().tolist() == [2, 1, 0]
    assert r.tokens_per_expert(kept_only=False).tolist() == [4, 1, 0]
    assert r.dropped_fraction() == pytest.approx(2 / 5)


def test_gates_switch_keeps_p_and_gshard_renormalises():
    logits = torch.randn(16, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    one = top_k_gating(logits, 1, 10.0)
    assert torch.allclose(one.gates[:, 0], probs.max(-1).values)  # not 1: the router gets a gradient
    two = top_k_gating(logits, 2, 10.0)
    assert torch.allclose(two.gates.sum(-1), torch.ones(16, dtype=torch.float64))
    raw = top_k_gating(logits, 2, 10.0, normalize=False)
    assert torch.allclose(raw.gates, probs.topk(2, -1).values)
    dense = two.combine_weights()
    assert dense.shape == (16, 6) and torch.allclose(dense.sum(-1), torch.ones(16, dtype=torch.float64))


def test_load_balancing_loss_is_one_when_uniform_and_n_when_collapsed():
    uniform = top_k_gating(torch.zeros(8, 4), 1, 1.0)
    # all probabilities 1/4; first choices all go to expert 0 (ties): f = (1, 0, 0, 0), P = 1/4 each
    assert float(load_balancing_loss(uniform)) == pytest.approx(1.0)
    collapsed = top_k_gating(torch.tensor([[50.0, 0, 0, 0]] * 8), 1, 1.0)
    assert float(load_balancing_loss(collapsed)) == pytest.approx(4.0)
    logits = torch.randn(32, 5, generator=torch.Generator().manual_seed(1))
    r = top_k_gating(logits, 2, 1.0)
    f = torch.bincount(logits.argmax(-1), minlength=5).float() / 32
    want = 5 * (f * torch.softmax(logits, -1).mean(0)).sum()
    assert float(load_balancing_loss(r)) == pytest.approx(float(want))


def test_router_z_loss_matches_its_formula():
    logits = torch.randn(10, 4, generator=torch.Generator().manual_seed(2))
    want = (logits.exp().sum(-1).log() ** 2).mean()
    assert float(router_z_loss(logits)) == pytest.approx(float(want), rel=1e-6)
    assert float(router_z_loss(torch.zeros(0, 4))) == 0.0


def test_noisy_router_is_deterministic_in_eval_and_reproducible_in_training():
    torch.manual_seed(0)
    router = Router(6, 4, noisy=True)
    x = torch.randn(5, 6)
    router.eval()
    assert torch.equal(router(x), router.w_g(x))
    router.train()
    a = router(x, torch.Generator().manual_seed(3))
    b = router(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and not torch.allclose(a, router.w_g(x))


# --------------------------------------------------------------------------------------------------
# The reference layer
# --------------------------------------------------------------------------------------------------

def test_reference_layer_matches_a_token_by_token_loop_and_drops_to_zero():
    torch.manual_seed(0)
    layer = MoELayer(6, 12, num_experts=4, k=2, capacity_factor=0.5).double()
    x = torch.randn(20, 6, dtype=torch.float64)
    out = layer(x)
    r = out.routings[0]
    assert 0 < r.dropped_fraction() < 1
    for t in range(20):
        want = sum(r.gates[t, c] * layer.experts[int(r.expert_index[t, c])](x[t]) for c in range(2)
                   if r.kept[t, c])
        want = torch.zeros(6, dtype=torch.float64) if isinstance(want, int) else want
        assert torch.allclose(out.y[t], want, atol=TOL)
    fully_dropped = ~r.kept.any(1)
    assert fully_dropped.any() and out.y[fully_dropped].abs().sum() == 0


def test_groups_count_capacity_per_group():
    torch.manual_seed(1)
    layer = MoELayer(4, 8, num_experts=2, capacity_factor=1.0)
    out = layer(torch.randn(3, 5, 4), group_sizes=[6, 9])  # any leading shape; tokens flattened in order
    assert out.y.shape == (3, 5, 4)
    assert [r.capacity for r in out.routings] == [3, 5]


# --------------------------------------------------------------------------------------------------
# Expert parallelism on real ranks: parity, autograd through all-to-all, traffic, bad input
# --------------------------------------------------------------------------------------------------

def _cases(p: int) -> list[ParityCase]:
    experts = 6 if p == 3 else 4 if p < 4 else 8
    uneven = [3 + 4 * r for r in range(p)]
    with_empty = [0] + [7] * (p - 1) if p > 1 else [5]
    return [ParityCase(uneven, experts, k=1, capacity_factor=1.0),
            ParityCase(uneven, experts, k=2, capacity_factor=0.75),                     # many drops
            ParityCase(with_empty, experts, k=2, capacity_factor=2.0, normalize=False),  # a rank with 0
            ParityCase([9] * p, p, k=p, capacity_factor=1.25, seed=3)]                   # k = E, 1 per rank


def _on_ranks(p: int) -> dict:
    import torch.distributed as dist

    from distlab.collectives import pairwise_all_to_all
    from distlab.moe.__main__ import report
    from distlab.moe.expert_parallel import all_to_all

    out: dict = {"parity": expert_parallel_parity(_cases(p))}
    r = dist.get_rank()
    # all_to_all with uneven splits equals chapter 1's pairwise all-to-all, and its backward is the reverse.
    sends = [(r + j) % 3 for j in range(p)]
    recvs = [(j + r) % 3 for j in range(p)]
    x = torch.arange(sum(sends), dtype=torch.float64).add(100 * r).requires_grad_()
    y = all_to_all(x.unsqueeze(1), recvs, sends).squeeze(1)
    ours = pairwise_all_to_all(list(torch.split(x.detach().unsqueeze(1), sends)), output_split_sizes=recvs)
    out["matches_pairwise"] = torch.equal(y.detach(), torch.cat(ours).squeeze(1))
    (y * torch.arange(len(y), dtype=torch.float64)).sum().backward()
    out["grad"] = x.grad.tolist()
    out["sent_to"] = sends
    # A collapsed router: every token picks expert 0, so the other ranks' experts get no rows. Every
    # rank must still join both all-to-alls of the backward pass (or the others would wait forever).
    torch.manual_seed(0)
    ref = MoELayer(4, 8, num_experts=p, k=1, capacity_factor=float(p)).double()
    with torch.no_grad():
        ref.router.w_g.weight.zero_()
        ref.router.w_g.weight[0, 0] = 10.0
    x = torch.randn(6 * p, 4, dtype=torch.float64)
    x[:, 0] = 1.0
    x_ref, x_mine = x.clone().requires_grad_(), x[6 * r:6 * r + 6].clone().requires_grad_()
    ref(x_ref, group_sizes=[6] * p).y.square().sum().backward()
    mine = ExpertParallelMoE.from_reference(ref)(x_mine)
    mine.y.square().sum().backward()
    out["collapsed"] = (mine.routing.tokens_per_expert().tolist(),
                        float((x_mine.grad - x_ref.grad[6 * r:6 * r + 6]).abs().max()))
    try:
        ExpertParallelMoE(4, 8, num_experts=p + 1 if p > 1 else 0)
    except ValueError as e:
        out["error"] = str(e)
    if p == 2:
        out["report"] = report(argparse.Namespace(experts=4, k=2, capacity_factor=1.25, tokens=32, d_model=8,
                                                  skew=0.0, steps=2, seed=0, dtype="float32"))
    if p == 4:
        out["halves"] = _on_ep_halves()
    return out


def _on_ep_halves() -> dict:
    """4 ranks as grid(dp=2, ep=2): expert parallelism on each half ({0, 1} and {2, 3}) on its own, with
    the 2-rank cases; every group-relative rank number (experts held, split sizes) must be right."""
    m = mesh.grid(dp=2, ep=2)
    group = m["ep"].get_group()
    layer = ExpertParallelMoE(4, 8, num_experts=4, group=group)
    rows = measure_traffic(tokens_per_rank=16, d_model=8, d_hidden=16, num_experts=4, k=2, steps=1,
                           dtype=torch.float64, group=group)
    return {"parity": expert_parallel_parity(_cases(2), group), "dp": m.get_local_rank("dp"),
            "ep": (layer.rank, layer.world_size, layer.first_expert), "traffic": rows[0]}


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_expert_parallel_matches_the_reference(p):
    results = launch.run(_on_ranks, p, p, timeout=30)
    for rank, res in enumerate(results):
        for case in res["parity"]:
            assert case.same_routing, f"rank {rank}: routing differs for {case.case}"
            assert case.worst() < TOL, f"rank {rank}, {case.case}: {case.errors}"
        assert res["matches_pairwise"]
        counts, grad_err = res["collapsed"]
        assert counts == [6] + [0] * (p - 1) and grad_err < TOL
    # Gradient of y_j = x_i (moved by the all-to-all) with loss sum(pos * y): each x gets the position its
    # value landed at on the receiving rank.
    for rank, res in enumerate(results):
        expected = []
        for j, n in enumerate(res["sent_to"]):
            before = sum((q + j) % 3 for q in range(rank))  # rows rank j receives from ranks before me
            expected += [float(before + i) for i in range(n)]
        assert res["grad"] == expected
    for res in results:  # the report's verdict names the claim, not the differences
        assert all(case.verdict().endswith(": ok") for case in res["parity"])
    # Traffic: everything sent is received; a case with drops sends less than k*T rows.
    for c in range(4):
        sent = sum(res["parity"][c].comm.bytes_sent for res in results)
        received = sum(res["parity"][c].comm.bytes_received for res in results)
        assert sent == received
    if p > 1:
        assert f"num_experts={p + 1} is not divisible by world_size={p}" in results[0]["error"]
    else:
        assert "num_experts=0 must be a positive integer" in results[0]["error"]
    if p == 2:
        text = results[0]["report"]
        # k * T * (p - 1) / p rows of d_model float32 values: 2 * 32 * 1/2 * 8 * 4 bytes
        assert "parity with the single-process layer (float64): ok on every rank" in text
        assert "predicted 1,024" in text
    if p == 4:
        for rank, res in enumerate(results):
            halves = res["halves"]
            assert halves["dp"] == rank // 2 and halves["ep"] == (rank % 2, 2, 2 * (rank % 2))
            for case in halves["parity"]:
                assert case.passed, f"rank {rank}: {case.verdict()} {case.errors}"
            assert halves["traffic"].dispatch_bytes > 0


def test_comm_stats_count_only_rows_that_leave_the_rank():
    from distlab.moe.expert_parallel import AllToAllStats

    stats = AllToAllStats(rank=1, send_rows=[3, 5, 2], recv_rows=[1, 5, 0], row_bytes=32, count_bytes=24)
    assert stats.bytes_sent == (3 + 2) * 32 and stats.bytes_received == 1 * 32


# --------------------------------------------------------------------------------------------------
# Cost arithmetic, experiments, figures, exercises
# --------------------------------------------------------------------------------------------------

def test_parameters_grow_with_experts_but_flops_with_k():
    d, h = 512, 2048
    dense = cost_model.ffn_parameters(d, h)
    assert cost_model.moe_parameters(d, h, 64) == 64 * dense + 64 * d
    assert cost_model.moe_flops_per_token(d, h, 64, 1) == 4 * d * h + 2 * d * 64
    k1, k2 = (cost_model.moe_flops_per_token(d, h, 64, k) for k in (1, 2))
    assert k2 - k1 == 4 * d * h


def test_all_to_all_prediction():
    pred = cost_model.predict_all_to_all(256, 64, 2, 4, bytes_per_element=4)
    assert pred.rows_per_all_to_all == 2 * 256 * 3 / 4
    assert pred.bytes_per_all_to_all == 384 * 256 and pred.step_bytes == 4 * 384 * 256
    capped = cost_model.predict_all_to_all(256, 64, 2, 4, capacity_factor=0.5, num_experts=8)
    assert capped.send_buffer_bytes == 8 * 32 * 256
    from distlab.collectives.cost_model import MachineParams

    timed = cost_model.predict_all_to_all(256, 64, 2, 4, params=MachineParams(alpha=1e-5, beta=1e-9))
    assert timed.seconds_per_all_to_all == pytest.approx(3 * 1e-5 + 0.75 * 512 * 256 * 1e-9)


def test_drop_rate_falls_with_capacity_and_rises_with_skew():
    factors = [0.5, 1.0, 1.5, 2.0, 3.0]
    flat = load_balance.drop_rate_curve(factors, skew=0.0)
    skewed = load_balance.drop_rate_curve(factors, skew=1.0)
    assert flat == sorted(flat, reverse=True) and skewed == sorted(skewed, reverse=True)
    assert all(s >= f for s, f in zip(skewed, flat, strict=True)) and flat[-1] == 0.0
    with pytest.raises(ValueError, match=r"skew=-1 must be >= 0"):
        load_balance.skewed_tokens(4, 2, -1)


def test_balancing_loss_evens_out_the_load():
    without = load_balance.train_balance(0.0, steps=40)
    with_aux = load_balance.train_balance(1e-2, steps=40)
    assert float(without.imbalance()[-10:].mean()) > 2 * float(with_aux.imbalance()[-10:].mean())
    assert sum(with_aux.dropped[-10:]) < sum(without.dropped[-10:])


def test_send_matrix_rows_add_up_to_the_kept_assignments():
    rows = load_balance.send_matrix(8, 2, 10.0, 0.0, 4, tokens_per_rank=32)
    assert rows.shape == (4, 4) and rows.sum(1).tolist() == [64] * 4


@pytest.mark.parametrize("make", [moe_figures.routing_histogram_figure, moe_figures.send_matrix_figure])
def test_figures_draw(make):
    fig = make()
    assert isinstance(fig, Figure) and all(ax.get_title() for ax in fig.axes)


def _good_gating(logits, k, capacity):
    return top_k_gating(logits, k, 1.0, capacity=capacity).combine_weights()


def _good_combine(x, combine, experts):
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        t = torch.nonzero(combine[:, e]).squeeze(1)
        if t.numel():
            y = y.index_add(0, t, combine[t, e, None] * expert(x[t]))
    return y


def test_exercise_checks_pass_the_solutions():
    assert exercises.check_top_k_gating(_good_gating)
    assert exercises.check_dispatch_combine(_good_combine)
    for label, logits, k, c in exercises._gating_cases():
        assert torch.allclose(exercises.combine_weights(logits, k, c), _good_gating(logits, k, c)), label


def _softmax_after(logits, k, capacity):
    top, index = logits.topk(k, -1)
    kept = top_k_gating(logits, k, 1.0, capacity=capacity).kept
    return torch.zeros_like(logits).scatter_add(1, index, torch.softmax(top, -1) * kept)


@pytest.mark.parametrize("fn, message", [
    (_softmax_after, "softmax was taken after the top-k"),
    (lambda z, k, c: top_k_gating(z, k, 1.0, normalize=False, capacity=c).combine_weights(),
     "not renormalised"),
    (lambda z, k, c: top_k_gating(z, k, 1.0, capacity=z.shape[0]).combine_weights(),
     "capacity is not enforced"),
    (lambda z, k, c: exercises.combine_weights(z, k, c, order="token"), "wrong order: you filled the experts "
                                                                         "token by token"),
    (lambda z, k, c: exercises.combine_weights(z, k, c, order="reverse"), "from the last token backwards"),
    (lambda z, k, c: exercises.combine_weights(z, k, c, renormalize_after_drop=True), "renormalised after"),
    (lambda z, k, c: z.shape, "returned a Size"),
])
def test_gating_check_names_the_mistake(fn, message):
    result = exercises.check_top_k_gating(fn)
    assert not result and message in str(result)


@pytest.mark.parametrize("fn, message", [
    (lambda x, w, ex: sum(w[:, e, None] * m(x) for e, m in enumerate(ex)), "dispatch only the tokens"),
    (lambda x, w, ex: _good_combine(x, (w > 0).double(), ex), "gate weights were not applied"),
    (lambda x, w, ex: x + _good_combine(x, w, ex), "y already includes x"),
    (lambda x, w, ex: sum(m(x) for m in ex), "every expert's output was added"),
])
def test_combine_check_names_the_mistake(fn, message):
    result = exercises.check_dispatch_combine(fn)
    assert not result and message in str(result)


def _hand_forward(layer, x, differentiable=True):
    """Exercise 3's solution: ExpertParallelMoE's forward pass, written out by hand."""
    import torch.distributed as dist

    from distlab.moe import all_to_all

    def send(rows, output_splits, input_splits):
        if differentiable:
            return all_to_all(rows, output_splits, input_splits)
        out = rows.new_empty((sum(output_splits), rows.shape[1]))
        dist.all_to_all_single(out, rows.detach(), output_splits, input_splits)
        return out

    p, per_rank = dist.get_world_size(), layer.experts_per_rank
    routing = top_k_gating(layer.router(x), layer.k, layer.capacity_factor, layer.normalize)
    token, choice = torch.nonzero(routing.kept, as_tuple=True)
    expert = routing.expert_index[token, choice]
    order = torch.argsort(expert, stable=True)
    token, choice, expert = token[order], choice[order], expert[order]
    counts = torch.bincount(expert, minlength=layer.num_experts)
    incoming = torch.empty_like(counts)
    dist.all_to_all_single(incoming, counts)
    ins, outs = counts.view(p, per_rank).sum(1).tolist(), incoming.view(p, per_rank).sum(1).tolist()
    rows = send(x[token], outs, ins)
    owner = torch.arange(per_rank).repeat(p).repeat_interleave(incoming)
    done = torch.zeros_like(rows)
    for j, ffn in enumerate(layer.experts):
        idx = torch.nonzero(owner == j, as_tuple=True)[0]
        done = done.index_copy(0, idx, ffn(rows[idx]))
    back = send(done, ins, outs)
    return torch.zeros_like(x).index_add(0, token, routing.gates[token, choice, None] * back)


def test_expert_parallel_check_passes_the_solution_and_names_a_missing_autograd():
    assert exercises.check_expert_parallel(_hand_forward, world_sizes=(2,))
    result = exercises.check_expert_parallel(partial(_hand_forward, differentiable=False), world_sizes=(2,))
    assert not result and "dist.all_to_all_single is not differentiable" in str(result)
