"""Section 3 of chapter 11: local SGD, DiLoCo and streaming DiLoCo on ranks against the same algorithm
with the replicas as a loop in one process, DiLoCo's reduction to data parallelism, the bytes the comm_log
counts against the bandwidth model, and the errors of bad settings.

One launch of 4 ranks runs every method on the sub-groups of 1, 2, 3 and 4 ranks; everything else runs
without ranks. float64 for the parity runs (TOLERANCE[float64]); the bfloat16 wire is held to bfloat16's.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from distlab import launch, parity, reference
from distlab.fault_tolerance import bandwidth
from distlab.fault_tolerance.diloco import DiLoCo, OuterNesterov
from distlab.fault_tolerance.local_sgd import LocalSGD
from distlab.fault_tolerance.replica_loop import Recipe, on_ranks, simulate
from distlab.fault_tolerance.streaming import StreamingDiLoCo, check_fragments, layer_fragments, sync_offsets

STEPS, BATCH, LR = 4, 12, 0.05


def _task() -> reference.Task:
    return reference.gpt_task(n_layer=1, n_embd=16, block_size=8, n=60)


RECIPES = {  # name: (recipe, world sizes); streaming K=3 with H=4 staggers fragments at steps 1, 2 and 4;
    # STEPS is a whole number of rounds of every recipe
    "dp": (Recipe("dp"), (2, 4)),  # chapter 2 checks data parallelism at every size; here it is the baseline
    "local_sgd": (Recipe("local_sgd", 2, inner="sgd", inner_lr=LR), (1, 2, 3, 4)),
    "diloco": (Recipe("diloco", 2), (1, 2, 3, 4)),
    "streaming": (Recipe("streaming", 4, fragments=3), (1, 2, 3, 4)),
    "streaming_bf16": (Recipe("streaming", 2, fragments=2, sync_dtype=torch.bfloat16), (3,)),
    "diloco_h1": (Recipe("diloco", 1, outer_lr=1.0, outer_momentum=0.0, inner="sgd", inner_lr=LR),
                  (1, 2, 3, 4)),
}


def _every_method_on_sub_groups() -> dict[tuple[str, int], object]:
    task, out = _task(), {}
    groups = {p: dist.new_group(list(range(p))) for p in (1, 2, 3, 4)}
    for name, (recipe, sizes) in RECIPES.items():
        for p in sizes:
            if dist.get_rank() < p:
                out[(name, p)] = on_ranks(recipe, task, STEPS, BATCH, seed=1, group=groups[p],
                                          dtype=torch.float64)
    return out


@pytest.fixture(scope="module")
def rank_runs() -> list[dict]:
    return launch.run(_every_method_on_sub_groups, 4, timeout=240.0)


def test_every_method_on_1_to_4_ranks_equals_the_replica_loop(rank_runs: list[dict]) -> None:
    task = _task()
    for name, (recipe, sizes) in RECIPES.items():
        if name == "diloco_h1":
            continue  # compared with data parallelism itself below
        dtype = recipe.sync_dtype or torch.float64
        for p in sizes:
            sim = simulate(recipe, task, p, STEPS, BATCH, seed=1, dtype=torch.float64)
            for r in range(p):
                ours = rank_runs[r][(name, p)]
                report = parity.compare({"losses": ours.losses, "parameters": ours.params},
                                        {"losses": sim[r].losses, "parameters": sim[r].params},
                                        dtype=dtype, label=f"{name} p={p} replica {r}", against="the loop")
                report.assert_passed()
            if recipe.method in ("diloco", "streaming"):
                parity.compare(rank_runs[0][(name, p)].pseudo_gradients, sim[0].pseudo_gradients,
                               dtype=dtype, name="pseudo-gradients").assert_passed()


def test_diloco_with_h1_outer_lr1_and_no_momentum_is_data_parallelism(rank_runs: list[dict]) -> None:
    """theta - 1 * mean(theta - (theta - lr g_r)) = theta - lr mean(g_r): one SGD step on the whole batch."""
    task = _task()
    model = task.build(1).double()
    ref = reference.train_reference(model, task.batches(STEPS, BATCH, 1), task.loss,
                                    reference.SGD(model.parameters(), LR))
    for p in (1, 2, 3, 4):
        ours = rank_runs[0][("diloco_h1", p)]
        parity.compare(ours.params, ref.params, dtype=torch.float64, name="parameters",
                       label=f"p={p}", against="data parallelism").assert_passed()


def test_the_comm_log_counts_what_the_bandwidth_model_predicts(rank_runs: list[dict]) -> None:
    """Whole rounds: the model's bytes per step times the steps (streaming's fragments of uneven sizes
    included: each is synchronised once per round)."""
    n = sum(t.numel() for t in rank_runs[0][("dp", 4)].params.values())
    for name, (recipe, sizes) in RECIPES.items():
        assert STEPS % recipe.sync_every == 0, f"{name}: make STEPS a whole number of rounds"
        wire = 2 if recipe.sync_dtype == torch.bfloat16 else 8  # bfloat16 or the float64 parameters
        for p in sizes:
            run = rank_runs[0][(name, p)]
            expected = STEPS * bandwidth.sent_bytes_per_step(recipe.method, n, p, recipe.sync_every,
                                                             bytes_per_value=wire)
            assert math.isclose(run.sent_bytes, expected), (
                f"{name} p={p}: the log counts {run.sent_bytes} bytes, the model {expected}")


# ---------------------------------------------------------------------------------------------- no ranks

def test_streaming_with_one_fragment_is_diloco_and_local_sgd_is_diloco_at_lr1() -> None:
    task = _task()
    base = dict(task=task, replicas=2, steps=STEPS, global_batch=BATCH, seed=3, dtype=torch.float64)
    diloco = simulate(Recipe("diloco", 2), **base)[0]
    one = simulate(Recipe("streaming", 2, fragments=1), **base)[0]
    parity.compare(one.params, diloco.params, dtype=torch.float64).assert_passed()
    avg = simulate(Recipe("local_sgd", 2, inner="sgd", inner_lr=LR), **base)[0]
    lr1 = simulate(Recipe("diloco", 2, outer_lr=1.0, outer_momentum=0.0, inner="sgd", inner_lr=LR), **base)[0]
    parity.compare(avg.params, lr1.params, dtype=torch.float64).assert_passed()


def test_outer_nesterov_is_torch_sgd_with_nesterov() -> None:
    torch.manual_seed(0)
    ours, theirs = torch.randn(5, dtype=torch.float64), None
    theirs = torch.nn.Parameter(ours.clone())
    opt = torch.optim.SGD([theirs], lr=0.7, momentum=0.9, nesterov=True)
    outer = OuterNesterov(0.7, 0.9)
    for _ in range(4):
        delta = torch.randn(5, dtype=torch.float64)
        outer.step([ours], [delta])
        theirs.grad = delta.clone()
        opt.step()
    parity.compare(ours, theirs.detach(), dtype=torch.float64).assert_passed()


def test_fragment_schedule_and_layer_fragments() -> None:
    assert sync_offsets(4, 3) == [1, 2, 4] and sync_offsets(6, 2) == [3, 6] and sync_offsets(5, 1) == [5]
    model = _task().build(0)
    names = [n for n, _ in model.named_parameters()]
    for k in (1, 2, 3, 5):
        fragments = layer_fragments(model, k)
        assert len(fragments) == k and sum(fragments, []) == names, f"k={k}: {fragments}"


def test_bad_settings_name_the_parameter_and_the_fix() -> None:
    model = _task().build(0)
    inner = reference.SGD(model.parameters(), LR)
    names = [n for n, _ in model.named_parameters()]
    cases = [
        (lambda: DiLoCo(model, inner, 0), "sync_every=0 must be a positive integer"),
        (lambda: LocalSGD(model, inner, -2), "sync_every=-2 must be a positive integer"),
        (lambda: DiLoCo(model, inner, 4, outer_lr=0.0), "outer_lr=0.0 must be a positive number"),
        (lambda: DiLoCo(model, inner, 4, outer_lr=-1), "pass e.g. outer_lr=0.7"),
        (lambda: StreamingDiLoCo(model, inner, 4, [names[:2]]), "fragments do not cover the model"),
        (lambda: check_fragments(model, [names, names[:1]]), "in exactly one fragment"),
        (lambda: check_fragments(model, [names + ["nope"]]), "'nope', which is not a parameter"),
        (lambda: StreamingDiLoCo(model, inner, 2, layer_fragments(model, 3)),
         "use between 1 and 2 fragments"),
        (lambda: Recipe("diloco", sync_every=0), "sync_every=0"),
        (lambda: Recipe("gossip"), "method='gossip' is not one of"),
        (lambda: bandwidth.step_seconds(1.0, 1e9, 0.0), "link_GBps=0.0 must be positive"),
        (lambda: bandwidth.break_even_GBps(1.0, 1e9, 1e8, 0.0), "efficiency=0.0 must be in (0, 1]"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError) as info:
            make()
        assert message in str(info.value), f"expected {message!r} in {info.value}"


def test_bandwidth_model_by_hand() -> None:
    n, r = 1_000_000, 2
    dp = bandwidth.sent_bytes_per_step("dp", n, r, bytes_per_value=2)
    assert dp == 2 * (r - 1) / r * n * 2  # the ring's 2 (R-1)/R of the buffer
    assert bandwidth.sent_bytes_per_step("diloco", n, r, 100, bytes_per_value=2) == dp / 100
    assert bandwidth.peak_bytes("streaming", n, r, fragments=4) == bandwidth.peak_bytes("diloco", n, r) / 4
    assert bandwidth.powersgd_values([(64, 32), (32,), (2, 100)], rank=2) == 2 * 96 + 32 + 200
    # L* solves (c + V/L) / eta = c + V_dp / L
    c, eta, v = 0.5, 0.8, dp / 100
    star = bandwidth.break_even_GBps(c, dp, v, eta)
    lhs = bandwidth.step_seconds(c, v, star) / eta
    assert math.isclose(lhs, bandwidth.step_seconds(c, dp, star), rel_tol=1e-12)
    assert bandwidth.break_even_GBps(c, dp, v, 1.0) == math.inf
    assert bandwidth.break_even_GBps(c, dp, dp, 0.9) == 0.0
    # the chapter-8 cluster: one NDR NIC per H100 (400 Gb/s = 50 GB/s per direction)
    assert bandwidth.nic_GBps("DGX H100") == 50.0
    # two-level ring: at least the inter-node ring of N b / 8 bytes between 2 servers over a 50 GB/s NIC
    assert bandwidth.cluster_dp_seconds(10**9, 2) > 2 * 10**9 / 8 / (50 * 1e9)
