"""Chapter 6 at scale, on one process: dropless routing and its grouped products, node-limited routing,
auxiliary-loss-free balancing, the dispatch cost model, its figure, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from matplotlib.figure import Figure

from distlab.moe import MoELayer, dispatch_cost, top_k_gating
from distlab.moe.aux_free import biased_top_k_gating, train_aux_free, update_bias
from distlab.moe.dropless import DroplessMoE, dense_reference, dropless_gating, grouped_mm, load_imbalance
from distlab.moe.hierarchical import HierarchicalMoE
from distlab.moe.load_balance import train_balance
from distlab.moe.node_limited import NodeLayout, NodeLimitedMoE, node_limited_gating, nodes_reached
from distlab.moe.scale_figures import dispatch_cost_figure
from distlab.parity import compare

F64 = torch.float64


def test_dropless_layer_matches_the_dense_reference_outputs_and_gradients():
    torch.manual_seed(0)
    layer = DroplessMoE(6, 10, num_experts=5, k=2).double()
    x = torch.randn(2, 13, 6, dtype=F64)  # 26 tokens: no expert gets a multiple of anything
    w = torch.randn(2, 13, 6, dtype=F64)
    grads = []
    for run in (lambda z: layer(z).y, lambda z: dense_reference(layer, z)):
        layer.zero_grad()
        z = x.clone().requires_grad_()
        y = run(z)
        (y * w).sum().backward()
        grads.append({"output": y.detach(), "gradients": {"x": z.grad, **{n: p.grad.clone() for n, p in
                                                                          layer.named_parameters()}}})
    report = compare(grads[0], grads[1], dtype=F64, against="the dense reference")
    assert report.passed, report.flat()
    out = layer(x)
    assert sum(out.group_sizes) == 2 * 26 and out.routing.dropped_fraction() == 0.0


def test_dropless_equals_chapter_6_layer_when_capacity_never_binds():
    torch.manual_seed(1)
    ref = MoELayer(4, 8, num_experts=4, k=2, capacity_factor=4.0).double()  # C = T: nothing dropped
    layer = DroplessMoE(4, 8, num_experts=4, k=2).double()
    layer.router.load_state_dict(ref.router.state_dict())
    for e, ffn in enumerate(ref.experts):
        layer.experts.load_expert(e, ffn)
    x = torch.randn(17, 4, dtype=F64)
    assert torch.allclose(layer(x).y, ref(x).y, atol=1e-12)
    logits = torch.randn(17, 4, dtype=F64)
    a, b = dropless_gating(logits, 2), top_k_gating(logits, 2, 4.0)
    assert torch.equal(a.expert_index, b.expert_index) and torch.allclose(a.gates, b.gates)


def test_grouped_mm_handles_empty_groups_and_checks_sizes():
    x, w = torch.randn(5, 3, dtype=F64), torch.randn(3, 3, 2, dtype=F64)
    y = grouped_mm(x, w, [2, 0, 3])
    assert torch.allclose(y, torch.cat([x[:2] @ w[0], x[2:] @ w[2]]))
    assert grouped_mm(x[:0], w, [0, 0, 0]).shape == (0, 2)
    with pytest.raises(ValueError, match=r"group_sizes=\[2, 2\] must have one entry per weight \(3\)"):
        grouped_mm(x, w, [2, 2])


def test_load_imbalance_names_what_a_capacity_would_drop_or_pad():
    imb = load_imbalance([6, 2, 2, 2])  # mean 3: the busiest has twice its share
    assert imb.max_over_mean == 2.0 and imb.dropped_at_rho_1 == pytest.approx(3 / 12)
    assert imb.padding_without_drops == pytest.approx(1 - 12 / 24)
    assert load_imbalance([0, 0]).max_over_mean == 1.0


def test_node_limited_routing_keeps_each_token_on_its_best_nodes():
    layout = NodeLayout(num_experts=8, world_size=4, ranks_per_node=1, k=4, max_nodes=2)
    logits = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=F64)
    routing = node_limited_gating(logits, layout)
    assert int(nodes_reached(routing, layout).max()) <= 2 and routing.kept.all()
    # by hand for token 0: node scores = sum of the top ceil(4/2) = 2 probabilities of each node's experts
    probs = torch.softmax(logits[0], -1).reshape(4, 2)
    best = set(probs.sum(-1).topk(2).indices.tolist())
    assert set((routing.expert_index[0] // 2).tolist()) <= best
    free = node_limited_gating(logits, NodeLayout(8, 4, 1, 4))  # M = None: plain top-k
    assert torch.equal(free.expert_index, top_k_gating(logits, 4, 10.0).expert_index)


def test_node_limited_reference_runs_without_torch_distributed():
    torch.manual_seed(0)
    ref = NodeLimitedMoE(4, 8, NodeLayout(4, 1, 1, 2)).double()
    x = torch.randn(9, 4, dtype=F64)
    for mode in ("hierarchical", "flat"):
        assert torch.allclose(HierarchicalMoE.from_reference(ref, mode)(x).y, ref(x)[0], atol=1e-12)


@pytest.mark.parametrize("make, message", [
    (lambda: NodeLayout(8, 4, 2, 2, max_nodes=3), r"max_nodes=3 is larger than the 2 nodes there are"),
    (lambda: NodeLayout(6, 4, 2, 2), r"num_experts=6 is not divisible by world_size=4"),
    (lambda: NodeLayout(8, 4, 2, 9), r"k=9 is larger than num_experts=8"),
    (lambda: NodeLayout(8, 4, 3, 2), r"ranks_per_node=3 does not divide world_size=4.*\[1, 2, 4\]"),
    (lambda: NodeLayout(8, 4, 1, 5, max_nodes=2), r"k=5 experts cannot fit on max_nodes=2 nodes of 2"),
    (lambda: NodeLayout(8, 4, 1, 2, max_nodes=0), r"max_nodes=0 must be a positive integer"),
    (lambda: HierarchicalMoE(4, 8, 4, 2, 1, dispatch="ring"), r"dispatch='ring' is not known"),
    (lambda: DroplessMoE(4, 8, 4, k=5), r"k=5 is larger than num_experts=4"),
    (lambda: update_bias(torch.zeros(4), torch.ones(4), -1.0), r"rate=-1.0 must be >= 0"),
    (lambda: update_bias(torch.zeros(4), torch.ones(3), 0.1), r"bias has shape \(4,\) but load has \(3,\)"),
    (lambda: biased_top_k_gating(torch.zeros(2, 4), torch.zeros(3), 1, 1.0), r"one entry per expert, \(4,\)"),
])
def test_bad_input_names_the_value_and_the_fix(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bias_moves_by_the_sign_of_the_load_error_and_steers_only_the_choice():
    bias = update_bias(torch.zeros(4), torch.tensor([10.0, 2.0, 2.0, 2.0]), 0.1)
    assert bias.tolist() == pytest.approx([-0.1, 0.1, 0.1, 0.1])
    logits = torch.tensor([[2.0, 1.9, 0.0, 0.0]], dtype=F64, requires_grad=True)
    r = biased_top_k_gating(logits, torch.tensor([-0.5, 0.0, 0.0, 0.0]), 1, 4.0)
    assert r.expert_index.item() == 1  # the bias moved the choice...
    assert r.gates.item() == pytest.approx(torch.softmax(logits, -1)[0, 1].item())  # ...not the gate
    r.gates.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_aux_loss_free_balances_the_load_without_a_loss_term():
    # Step 0 is the unbalanced start that train_balance(0.0) also starts from (bias 0, same seeds); without
    # balancing that run collapses further (tests/moe/test_moe.py), with the bias the load evens out.
    free = train_aux_free(1e-2, steps=30, tokens_per_step=128)
    start, end = float(free.imbalance()[:5].mean()), float(free.imbalance()[-10:].mean())
    assert end < 0.7 * start and start > 2
    assert sum(free.dropped[-10:]) < 0.5 * sum(free.dropped[:10])
    first = train_balance(0.0, steps=1, tokens_per_step=128)
    assert torch.equal(first.load[0], free.load[0])  # the same start


def test_node_count_law_and_the_expected_bytes():
    law = dispatch_cost.node_count_law(8, 4, 2)
    assert sum(law) == pytest.approx(1.0) and law[1] == pytest.approx(4 / 28)  # both on one node: 4 C(2,2)
    assert dispatch_cost.expected_nodes(8, 4, 2) == pytest.approx(1 + 24 / 28)
    assert dispatch_cost.expected_nodes(256, 8, 8, 4) <= 4 < dispatch_cost.expected_nodes(256, 8, 8)
    layout = NodeLayout(16, 4, 2, k=4)
    model = dispatch_cost.expected_cross_node_bytes(layout, tokens=10, d_model=8, bytes_per_element=4)
    assert model.flat == 2 * 4 * 10 * 0.5 * 32
    reach = dispatch_cost.expected_nodes(16, 2, 4)
    assert model.hierarchical == pytest.approx(10 * reach * 0.5 * (2 * 32 + 4 * 8))
    with pytest.raises(ValueError, match=r"nodes=3 must be a positive divisor of num_experts=8"):
        dispatch_cost.node_count_law(8, 3, 2)


def test_dispatch_time_reads_the_catalog_and_is_even_on_one_server():
    one = dispatch_cost.dispatch_time("DGX H100", 1, 256, 8, 4096, 7168)
    assert one.flat == pytest.approx(one.hierarchical)
    two = dispatch_cost.dispatch_time("DGX H100", 2, 256, 8, 4096, 7168, max_nodes=2)
    assert two.net_GBps == 50.0 and two.nvl_GBps == 450.0  # 400 Gb/s NIC per GPU; NVLink 4, per direction
    assert two.speedup > 1
    a100 = dispatch_cost.dispatch_time("DGX A100", 4, 256, 8, 4096, 7168, max_nodes=4)
    assert a100.net_GBps == 25.0 and math.isfinite(a100.speedup)


def test_dispatch_cost_figure_draws():
    fig = dispatch_cost_figure(nodes=(1, 2, 4), ks=(1, 8))
    assert isinstance(fig, Figure) and all(ax.get_title() for ax in fig.axes)
