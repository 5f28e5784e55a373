"""Tensor parallelism (chapter 5): parity with the dense GPT, the shard round trip, the communication
count, bad sizes, and the exercise check.

Parity is checked in float64, where the only differences are the order of floating-point additions
(the sums of the row-parallel layers and the all-reduces are split differently): 1e-10 is far above
that (about 1e-15 relative) and far below any real mistake (a missing term is O(1e-2) here). One float32
run checks the same at 1e-5 (float32 keeps about 7 digits).

Each launch costs seconds on two cores, so one launch per tensor-parallel size runs every check of that
size: plain and sequence-parallel, float64 and float32. A hang would end with the launcher's timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from distlab import launch, mesh
from distlab.comm_log import comm_log
from distlab.mesh import group_size
from distlab.models import GPT, GPTConfig
from distlab.tensor_parallel import cost_model
from distlab.tensor_parallel import exercises as ex
from distlab.tensor_parallel.bench import time_mlp_step
from distlab.tensor_parallel.comm import f, g, reduce_scatter_seq
from distlab.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from distlab.tensor_parallel.model import ParallelGPT, gather_state_dict, shard_state_dict
from distlab.tensor_parallel.parity import compare_with_dense

# 12 heads, hidden 48 and vocabulary 24 divide by 1, 2, 3 and 4; 12 tokens too (sequence parallelism).
CONFIG = GPTConfig(vocab_size=24, block_size=16, n_layer=2, n_head=12, n_embd=48)
BATCH, SEQ = 2, 12
TOL64, TOL32 = 1e-10, 1e-5


def ignored_targets(seed: int) -> torch.Tensor:
    """Next-token targets with a third of them set to -100 (F.cross_entropy's ignore_index)."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randint(CONFIG.vocab_size, (BATCH, SEQ), generator=gen)
    return t.masked_fill(torch.rand(BATCH, SEQ, generator=gen) < 1 / 3, -100)


def _cross_entropy_alone(group=None) -> float:
    """The vocabulary-parallel cross-entropy alone (some targets ignored) against F.cross_entropy on the
    whole logits: the largest difference in loss and gradient."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(6, CONFIG.vocab_size, generator=gen, dtype=torch.float64) * 4
    targets = torch.randint(CONFIG.vocab_size, (6,), generator=gen)
    targets[[1, 4]] = -100
    full = logits.clone().requires_grad_(True)
    ref = torch.nn.functional.cross_entropy(full, targets)
    ref.backward()
    p = group_size(group)
    r = dist.get_rank(group) if p > 1 else 0
    k = CONFIG.vocab_size // p
    mine = logits[:, r * k:(r + 1) * k].clone().requires_grad_(True)
    loss = vocab_parallel_cross_entropy(mine, targets, group)
    loss.backward()
    grad_diff = (mine.grad - full.grad[:, r * k:(r + 1) * k]).abs().max()
    return float(max(abs(loss.item() - ref.item()), grad_diff))


def _all_checks(config: GPTConfig) -> dict:
    """On each rank: parity reports, a PyTorch-built-in comparison of the parallel MLP, the layers alone,
    and (on 2 ranks) the exercise check's diagnoses. Without a process group it runs as one process."""
    p = group_size()
    reports = [compare_with_dense(config, BATCH, SEQ, seed=3, sequence_parallel=sp) for sp in (False, True)]
    reports.append(compare_with_dense(config, BATCH, SEQ, seed=4, dtype=torch.float32))
    reports += [compare_with_dense(config, BATCH, SEQ, seed=5, sequence_parallel=sp,
                                   targets=ignored_targets(5)) for sp in (False, True)]
    out = {"reports": reports, "ce": _cross_entropy_alone(), "errors": bad_inputs(config)}
    if p == 2:  # the references for the sub-group run on 4 ranks (dp index 1 uses seed 13)
        out["seed13"] = [compare_with_dense(config, BATCH, SEQ, seed=13, sequence_parallel=sp)
                         for sp in (False, True)]
        # our MLP beside PyTorch's ColwiseParallel/RowwiseParallel (timings are not asserted, only results)
        out["timed"] = time_mlp_step(hidden=32, batch=2, seq=4, iters=1)
        out["students"] = _students()
    if p == 4:
        out["subgroup"] = _on_tp_subgroup(config)
    return out


def _on_tp_subgroup(config: GPTConfig) -> dict:
    """4 ranks as grid(dp=2, tp=2): two independent TP = 2 models, one per dp index, each on its own
    tp group (ranks {0, 1} and {2, 3}), with seeds 3 and 13."""
    m = mesh.grid(dp=2, tp=2)
    group, dp = m["tp"].get_group(), m.get_local_rank("dp")
    reports = [compare_with_dense(config, BATCH, SEQ, seed=3 + 10 * dp, sequence_parallel=sp, group=group)
               for sp in (False, True)]
    timed = time_mlp_step(hidden=32, batch=2, seq=4, iters=1, group=group)
    return {"dp": dp, "tp_rank": dist.get_rank(group), "reports": reports, "ce": _cross_entropy_alone(group),
            "timed_diff": max(timed["ours_diff"], timed["torch_diff"])}


def _error(fn) -> str:
    try:
        fn()
    except Exception as e:  # the message is what the test checks
        return f"{type(e).__name__}: {e}"
    return "no error"


def bad_inputs(config: GPTConfig) -> dict[str, str]:
    """On every rank: the error each bad input raises. Every rank must raise before any collective (one
    that did not would wait in it, and the launch would time out)."""
    p, v = group_size(), config.vocab_size
    torch.manual_seed(0)
    model = ParallelGPT(config)
    idx = torch.randint(v, (BATCH, SEQ))
    big = idx.index_put((torch.tensor(1), torch.tensor(3)), torch.tensor(v))
    logits = torch.randn(3, v // p)
    errors = {
        "id too large": _error(lambda: model(big)),
        "negative target": _error(lambda: model(idx, idx.index_put((torch.tensor(0),), torch.tensor(-5)))),
        "target too large": _error(lambda: model(idx, idx + v)),
        "float ids": _error(lambda: model(idx.double())),
        "targets shape": _error(lambda: model(idx, idx[:, :5])),
        "embedding id": _error(lambda: VocabParallelEmbedding(v, 8)(torch.full_like(idx, -1))),
        "ce target": _error(lambda: vocab_parallel_cross_entropy(logits, torch.tensor([0, v, 1]))),
        "ce shape": _error(lambda: vocab_parallel_cross_entropy(logits, torch.tensor([0, 1]))),
        "sp length": _error(lambda: ParallelGPT(config, sequence_parallel=True)(idx[:, :7])),
        "reduce-scatter length": _error(lambda: reduce_scatter_seq(torch.randn(1, 7, 4), where="h.0.mlp")),
        "column": _error(lambda: ColumnParallelLinear(16, 64, name="c_fc")),
        "row": _error(lambda: RowParallelLinear(64, 16, name="c_proj")),
        "vocab": _error(lambda: VocabParallelEmbedding(10, 8)),
    }
    if p > 1:
        dist.barrier()
    return errors


@pytest.fixture(scope="module")
def runs() -> dict[int, list[dict]]:
    with _one_rank_world():  # one rank needs no launch: a world of one rank in this process
        out = {1: [_all_checks(CONFIG)]}
    out.update({p: launch.run(_all_checks, p, CONFIG, timeout=90) for p in (2, 3, 4)})
    return out


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_forward_and_gradients_match_dense(runs, p):
    for rank, out in enumerate(runs[p]):
        for rep in out["reports"]:  # plain, SP, float32, and ignored targets plain and SP
            assert rep.tp_size == p
            assert rep.passed, f"rank {rank}: {rep}"
            assert rep.verdict().endswith(": ok")
            assert len(rep.grads) == len(list(GPT(CONFIG).parameters()))  # every parameter was compared
        assert out["ce"] < TOL64


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_bad_inputs_raise_on_every_rank_with_the_value_and_the_fix(runs, p):
    for out in runs[p]:
        e = out["errors"]
        assert e["id too large"].startswith("IndexError: idx[1, 3] = 24 is outside the vocabulary: token ids "
                                            "must lie in [0, vocab_size=24)")
        assert e["negative target"].startswith("IndexError: targets[0, 0] = -5 is outside the vocabulary: "
                                               "token ids must lie in [0, vocab_size=24) (or "
                                               "ignore_index=-100)")
        assert e["target too large"].startswith("IndexError: targets[0, 0] = ")
        assert "is outside the vocabulary" in e["target too large"]
        assert e["float ids"].startswith("TypeError: idx has dtype torch.float64; token ids must be integers")
        assert "convert with idx.long()" in e["float ids"]
        assert e["targets shape"] == ("ValueError: targets have shape (2, 5), but idx (2, 12) needs B*T = 24 "
                                      "targets, one per token")
        assert "] = -1 is outside the vocabulary" in e["embedding id"]
        assert "targets[1] = 24 is outside the vocabulary: token ids must lie in [0, vocab_size=24)" \
            in e["ce target"]  # the whole vocabulary, not this rank's shard of it
        assert e["ce shape"].startswith("ValueError: targets have shape (2,) but the logits (3, ")
        if p == 1:
            assert e["sp length"] == e["reduce-scatter length"] == e["column"] == "no error"
            continue
        assert e["sp length"] == (f"ValueError: sequence length T=7 is not divisible by tensor-parallel "
                                  f"size {p}; sequence parallelism keeps T/p positions per rank: use a T "
                                  f"that is a multiple of {p}")
        assert e["reduce-scatter length"] == (
            f"ValueError: h.0.mlp: dimension 1 has length 7, which is not divisible by tensor-parallel size "
            f"{p}; sequence parallelism gives every rank an equal slice: use a length that is a multiple "
            f"of {p}")
        if p == 3:
            assert e["column"] == ("ValueError: c_fc.out_features=64 is not divisible by tensor-parallel "
                                   "size 3; choose a size that divides 64 (e.g. 1, 2, 4, 8)")
            assert "c_proj.in_features=64 is not divisible by tensor-parallel size 3" in e["row"]
        if p in (3, 4):
            assert f"vocab_size=10 is not divisible by tensor-parallel size {p}" in e["vocab"]


def test_ignored_targets_are_left_out_of_the_mean_as_in_cross_entropy(runs):
    # the parity above holds with a third of the targets at -100; the loss is the mean over the rest
    for p in (1, 2, 4):
        rep = runs[p][0]["reports"][3]
        assert torch.isfinite(rep.outputs["loss"]) and rep.passed
    # every target ignored: F.cross_entropy gives nan and zero gradients, and so does the parallel loss
    rep = compare_with_dense(CONFIG, BATCH, SEQ, seed=3, targets=torch.full((BATCH, SEQ), -100))
    assert torch.isnan(rep.outputs["loss"]) and rep.passed
    assert all(float(rep.outputs[n].abs().max()) == 0.0 for n in rep.grads)


def test_tp_on_a_sub_group_of_a_mesh_equals_dense_and_the_whole_world_run(runs):
    for rank, out in enumerate(runs[4]):
        sub = out["subgroup"]
        assert (sub["dp"], sub["tp_rank"]) == divmod(rank, 2)  # grid(dp=2, tp=2): tp groups {0,1}, {2,3}
        assert sub["ce"] < TOL64 and sub["timed_diff"] < TOL32
        world = runs[2][sub["tp_rank"]]["reports" if sub["dp"] == 0 else "seed13"]
        for got, want in zip(sub["reports"], world[:2], strict=True):
            assert got.tp_size == 2 and got.passed, f"rank {rank}: {got}"
            assert got.outputs.keys() == want.outputs.keys()
            for name, t in got.outputs.items():
                assert torch.allclose(t, want.outputs[name], rtol=0, atol=TOL64), (rank, name)
            assert cost_model.summary(got.records) == cost_model.summary(want.records)
    # the two dp indices trained different models (seeds 3 and 13), independently
    assert not torch.equal(runs[4][0]["subgroup"]["reports"][0].outputs["loss"],
                           runs[4][2]["subgroup"]["reports"][0].outputs["loss"])


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_shards_gather_back_to_the_dense_weights_exactly(runs, p):
    torch.manual_seed(3)
    dense = GPT(CONFIG).double().state_dict()
    for rep_index in (0, 1):  # plain and sequence parallel load the same shards
        shards = [out["reports"][rep_index].shard for out in runs[p]]
        back = gather_state_dict(shards, CONFIG)
        assert set(back) == set(dense)
        for name in dense:
            assert torch.equal(back[name], dense[name]), name


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_recorded_communication_matches_the_analytic_count(runs, p, sp):
    rep = runs[p][0]["reports"][int(sp)]
    expected = cost_model.expected_records(CONFIG, BATCH, SEQ, p, sp, dtype_bytes=8)
    assert cost_model.summary(rep.records) == cost_model.summary(expected)
    bsh = BATCH * SEQ * CONFIG.n_embd
    layer = [r for r in rep.records if r.where.startswith("h.0.")]
    for phase in cost_model.PHASES:
        got = sorted((r.op, r.numel) for r in layer if r.phase == phase)
        assert got == sorted(cost_model.per_layer_collectives(BATCH, SEQ, CONFIG.n_embd, sp)[phase])
        assert len(got) == (4 if sp else 2) and all(n == bsh for _, n in got)
    # the ranks agree on what they did
    assert all(cost_model.summary(out["reports"][int(sp)].records) == cost_model.summary(rep.records)
               for out in runs[p])


def test_parallel_mlp_matches_pytorch_builtin_tensor_parallel(runs):
    for out in runs[2]:
        timed = out["timed"]
        assert timed["ours_diff"] < TOL32 and timed["torch_diff"] < TOL32
        assert timed["bytes_per_step"] == 2 * 2 * 4 * 32 * 4  # two all-reduces of b x s x h float32
        assert all(timed[k] > 0 for k in ("ours_s", "torch_s", "collectives_s", "ours_over_torch"))


def test_sequence_parallel_moves_the_same_bytes_as_all_reduce():
    for p in (2, 4, 8):
        plain = cost_model.layer_wire_bytes(1, 2048, 4096, p)
        assert plain == pytest.approx(8 * (p - 1) / p * 2048 * 4096 * 2)
        assert cost_model.layer_wire_bytes(1, 2048, 4096, p, sequence_parallel=True) == pytest.approx(plain)
    assert cost_model.layer_wire_bytes(1, 2048, 4096, 1) == 0
    assert cost_model.wire_bytes("all_gather", 100.0, 4) == 75.0
    with pytest.raises(ValueError, match="op='broadcast' is not a collective"):
        cost_model.wire_bytes("broadcast", 1.0, 2)


def test_predicted_time_follows_the_ring_cost_model():
    from distlab.collectives.cost_model import MachineParams

    m = MachineParams(alpha=1e-5, beta=1e-9)
    recs = cost_model.expected_records(CONFIG, BATCH, SEQ, 4, dtype_bytes=4)
    n = BATCH * SEQ * CONFIG.n_embd * 4
    ar = [r for r in recs if r.numel == BATCH * SEQ * CONFIG.n_embd]
    want = len(ar) * (6 * 1e-5 + 2 * 3 / 4 * n * 1e-9) + 3 * (6 * 1e-5 + 2 * 3 / 4 * BATCH * SEQ * 4 * 1e-9)
    assert cost_model.predicted_time(recs, 4, m) == pytest.approx(want)
    assert cost_model.predicted_time(recs, 1, m) == 0.0
    assert cost_model.layer_time(1, 8, 16, 4, m) == pytest.approx(4 * (6e-5 + 1.5 * 1 * 8 * 16 * 2 * 1e-9))


@contextlib.contextmanager
def _one_rank_world() -> Iterator[None]:
    """torch.distributed in this process, as a world of one rank (what a log needs to see the calls)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_single_process_group_needs_no_torch_distributed():
    torch.manual_seed(0)
    dense = GPT(CONFIG).double()
    model = ParallelGPT.from_dense(dense)
    assert (model.tp_rank, model.tp_size) == (0, 1)
    idx = torch.randint(CONFIG.vocab_size, (BATCH, SEQ))
    assert torch.equal(model(idx)[0], dense(idx)[0])
    with _one_rank_world(), comm_log() as log:  # on a world of one rank the same calls run, and are logged
        assert torch.equal(model(idx)[0], dense(idx)[0])
    assert [r.op for r in log.records] == ["all_reduce"] * (1 + 2 * CONFIG.n_layer)


def test_shard_of_c_attn_splits_q_k_v_by_heads():
    cfg = GPTConfig(vocab_size=4, n_head=4, n_embd=8, n_layer=1)  # head size 2
    rows = torch.arange(24.0).unsqueeze(1)  # packed [q | k | v], 8 rows each
    shard = shard_state_dict({"h.0.attn.c_attn.weight": rows}, cfg, 1, 2)["h.0.attn.c_attn.weight"]
    assert shard.view(-1).tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]  # heads 2, 3 of q, k, v


# --- the exercise check ----------------------------------------------------------------------------

class RightF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class RightG(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class GTwice(RightG):  # all-reduces in both directions
    @staticmethod
    def backward(ctx, grad):
        return RightF.backward(ctx, grad)


class FNoReduce(RightF):
    @staticmethod
    def backward(ctx, grad):
        return grad


def right_shard(w, rank, size):
    k = w.shape[1] // size
    return w[:, rank * k:(rank + 1) * k]


def rows_shard(w, rank, size):
    k = w.shape[0] // size
    return w[rank * k:(rank + 1) * k]


def make_row_linear(g_fn, bias_every_rank=False, reduce=True):
    def row_linear(x, w, b):
        y = x @ w.T
        if bias_every_rank:
            return g_fn(y + b)
        return (g_fn(y) if reduce else y) + b
    return row_linear


def stub(*args):
    raise NotImplementedError("Your turn")


def _students() -> dict[str, list[str]]:
    right = (RightF.apply, RightG.apply, right_shard, make_row_linear(RightG.apply))
    variants = {
        "right": right,
        "bias on every rank": (*right[:3], make_row_linear(RightG.apply, bias_every_rank=True)),
        "missing all-reduce": (*right[:3], make_row_linear(RightG.apply, reduce=False)),
        "g reduces backward": (RightF.apply, GTwice.apply, right_shard, make_row_linear(GTwice.apply)),
        "f does not reduce": (FNoReduce.apply, *right[1:]),
        "rows shard": (RightF.apply, RightG.apply, rows_shard, right[3]),
        "not written": (stub, stub, stub, stub),
    }
    return {name: ex.run_checks(*fns) for name, fns in variants.items()}


def test_exercise_check_explains_each_mistake(runs):
    found = runs[2][0]["students"]
    assert found["right"] == []
    assert any("bias p = 2 times" in m for m in found["bias on every rank"])
    assert any("partial sums were never added up" in m for m in found["missing all-reduce"])
    assert any("g's backward all-reduces" in m for m in found["g reduces backward"])
    assert any("weight shard is p = 2 times too large" in m for m in found["g reduces backward"])
    assert any("f's backward returns only this rank's gradient" in m for m in found["f does not reduce"])
    assert any("take columns" in m for m in found["rows shard"])
    assert found["not written"] == [f"{name}: not written yet (it raises NotImplementedError)"
                                    for name in ("shard", "g", "f", "row_linear")]
    assert all(len(v) >= 1 for k, v in found.items() if k != "right")


def test_exercise_check_passes_a_right_student_and_rejects_bad_arguments():
    result = ex.check_tensor_parallel(RightF.apply, RightG.apply, right_shard, make_row_linear(RightG.apply),
                                      world_sizes=(3,))
    assert result.passed, str(result)
    with pytest.raises(ValueError, match="world_sizes=\\(5,\\) must hold sizes that divide 12"):
        ex.check_tensor_parallel(RightF.apply, RightG.apply, right_shard, right_shard, world_sizes=(5,))
    with pytest.raises(ValueError, match="f=1 is not callable"):
        ex.check_tensor_parallel(1, RightG.apply, right_shard, right_shard)


def test_f_and_g_are_identity_on_one_process():
    x = torch.randn(3, requires_grad=True)
    y = g(f(x, where="in"), where="out")
    y.sum().backward()
    assert torch.equal(y, x) and torch.equal(x.grad, torch.ones(3))
    x.grad = None
    with _one_rank_world(), comm_log() as log:
        y = g(f(x, where="in"), where="out")
        y.sum().backward()
    assert torch.equal(y, x) and torch.equal(x.grad, torch.ones(3))
    assert [(r.op, r.phase, r.where) for r in log.records] == [("all_reduce", "forward", "out"),
                                                               ("all_reduce", "backward", "in")]
