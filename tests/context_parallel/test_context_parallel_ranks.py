"""Chapter 10 on ranks: ring attention against dense causal attention at 2, 3 and 4 ranks, both layouts,
float64, outputs and gradients, with the work and the bytes of every rank against the formulas; an
uneven length padded; the course GPT and the memory measurement (2 ranks); and the cp sub-groups of a
2 x 2 mesh (4 ranks), where a GPT step with the batch split over dp and each sequence over cp, its loss
averaged and its gradients reduced over the flattened dp x cp group (`mesh.dp_cp_group`), equals one
process; the GPT's loss with ignored targets (-100: some, all, and the padding of an uneven length)
against F.cross_entropy(ignore_index=-100), loss and every gradient, at 1 to 4 ranks and both layouts.
One launch per world size (world size 1 is in test_context_parallel.py, and here without ranks for the
ignored targets)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab import launch
from distlab.context_parallel import cost_model
from distlab.context_parallel.parity import CPParityReport, attention_parity

TOL = 1e-12  # float64
SHAPE = {"batch": 2, "heads": 2, "head_dim": 8}


def _on_ranks(seq_len: int, uneven: int, extras: bool) -> dict:
    from distlab.context_parallel.parity import gpt_parity
    from distlab.context_parallel.saved_activations import measured_ring_bytes
    from distlab.mesh import grid

    layouts = ("zigzag", "contiguous")
    out = {"even": [attention_parity(layout, seq_len=seq_len, **SHAPE) for layout in layouts],
           "padded": [attention_parity(layout, seq_len=uneven, pad=True, **SHAPE)
                      for layout in ("zigzag", "contiguous")]}
    if extras:
        out["gpt"] = [gpt_parity(layout, seq_len=16) for layout in ("zigzag", "contiguous")]
        out["memory"] = measured_ring_bytes(seq_len, 1, 2, 8, "zigzag")
    if dist.get_world_size() == 4:  # the same 4 ranks as dp=2 x cp=2: each cp pair runs its own ring
        group = grid(dp=2, cp=2)["cp"].get_group()
        out["sub"] = [attention_parity(layout, seq_len=16, group=group, **SHAPE) for layout in layouts]
        out["dp_cp"] = _dp_cp_step()
    out["ignored"] = _ignored_targets_parity()
    return out


def _ignored_targets_parity(group: dist.ProcessGroup | None = None) -> dict[str, str]:
    """{case/layout: verdict} of the cp loss (summed over the group) and every gradient (all-reduced)
    against the dense GPT's F.cross_entropy(ignore_index=-100), in float64 (`distlab.parity.compare`).
    Cases: a third of the targets ignored; all of them (the dense loss is NaN, its gradients zero: NaN
    against NaN agrees, NaN against a number fails); an uneven length padded at its end, inputs with
    token 0 and targets with -100, against the dense run unpadded."""
    from distlab.context_parallel.layer import all_reduce_grads, cp_gpt_loss
    from distlab.context_parallel.layouts import pad_to_multiple
    from distlab.mesh import group_size
    from distlab.models import GPT, GPTConfig
    from distlab.parity import compare

    torch.manual_seed(3)
    config = GPTConfig(vocab_size=7, block_size=24, n_layer=1, n_head=2, n_embd=8)
    dense = GPT(config).double()
    g = torch.Generator().manual_seed(4)
    idx = torch.randint(0, config.vocab_size, (2, 24), generator=g)
    some = torch.randint(0, config.vocab_size, (2, 24), generator=g)
    some[torch.rand(2, 24, generator=g) < 1 / 3] = -100
    p = group_size(group)
    uneven = 4 * p - 1 if p > 1 else 5
    out = {}
    for case, (x, y) in {"some": (idx, some), "all": (idx, torch.full_like(idx, -100)),
                         "padded": (idx[:, :uneven], some[:, :uneven])}.items():
        for layout in ("zigzag", "contiguous"):
            ref, ring = GPT(config).double(), GPT(config).double()
            ref.load_state_dict(dense.state_dict())
            ring.load_state_dict(dense.state_dict())
            _, want = ref(x, y)
            want.backward()
            xs, ys = x, y
            if case == "padded":
                xs = pad_to_multiple(x, p, layout, dim=1)
                ys = pad_to_multiple(y, p, layout, dim=1, value=-100)
            loss = cp_gpt_loss(ring, xs, ys, group=group, layout=layout)
            loss.backward()
            all_reduce_grads(ring, group)
            total = loss.detach().clone()
            if p > 1:
                dist.all_reduce(total, group=group)
            ours = {"loss": total, "gradients": {n: q.grad for n, q in ring.named_parameters()}}
            theirs = {"loss": want.detach(), "gradients": {n: q.grad for n, q in ref.named_parameters()}}
            out[f"{case}/{layout}"] = compare(ours, theirs, dtype=torch.float64, equal_nan=True,
                                              label=f"{case}/{layout}").verdict()
    return out


def _dp_cp_step() -> dict:
    """grid(dp=2, cp=2): each dp index takes half of a batch of 4 sequences, its cp pair splits each
    sequence (ring attention); the loss is averaged and the gradients summed over dp x cp, then divided
    by dp. Returns the differences from the same GPT on the whole batch in one process, the members of
    the dp x cp group, the axis a comm_log names it by, and the error for an axis the mesh lacks."""
    import torch

    from distlab.comm_log import comm_log
    from distlab.context_parallel import all_reduce_grads, cp_gpt_loss
    from distlab.mesh import dp_cp_group, flat_group, grid
    from distlab.models import GPT, GPTConfig

    m = grid(dp=2, cp=2)
    dp, group = m["dp"].size(), dp_cp_group(m)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=16)
    dense, model = GPT(config).double(), GPT(config).double()
    model.load_state_dict(dense.state_dict())
    gen = torch.Generator().manual_seed(1)
    idx, targets = (torch.randint(0, config.vocab_size, (4, 16), generator=gen) for _ in range(2))
    _, ref = dense(idx, targets)
    ref.backward()
    rows = slice(2 * m.get_local_rank("dp"), 2 * m.get_local_rank("dp") + 2)
    loss = cp_gpt_loss(model, idx[rows], targets[rows], group=m["cp"].get_group())
    loss.backward()
    with comm_log(mesh=m) as log:
        all_reduce_grads(model, group)
        total = loss.detach().reshape(1).clone()
        dist.all_reduce(total, group=group)
    grads = max((a.grad / dp - b.grad).abs().max().item() for a, b in zip(model.parameters(),
                                                                         dense.parameters(), strict=True))
    try:
        flat_group(m, "tp")
        error = "no error"
    except ValueError as e:
        error = str(e)
    return {"loss": abs(total.item() / dp - ref.item()), "grads": grads, "error": error,
            "axes": {r.axis for r in log.records}, "members": dist.get_process_group_ranks(group)}


def _check_reports(reports: list[CPParityReport], p: int, seq_len: int) -> None:
    for rep in reports:
        assert max(rep.max_error.values()) <= TOL, rep
        r = rep.rank
        assert rep.blocks["full"] + rep.blocks["diagonal"] == cost_model.blocks_per_rank(p, rep.layout)[r]
        assert rep.blocks["skip"] == cost_model.skipped_per_rank(p, rep.layout)[r]
        # entries of Q K^T per batch element and head
        assert rep.score_entries == cost_model.score_entries_per_rank(p, seq_len, rep.layout)[r]
        sent = cost_model.bytes_per_rank(p, seq_len, SHAPE["batch"], SHAPE["heads"], SHAPE["head_dim"], 8)
        assert (rep.bytes_forward, rep.bytes_backward) == (sent["forward"], sent["backward"])


@pytest.mark.parametrize(("p", "seq_len", "uneven"), [(2, 24, 21), (3, 24, 23), (4, 32, 30)])
def test_ring_attention_on_ranks(p: int, seq_len: int, uneven: int) -> None:
    results = launch.run(_on_ranks, p, seq_len, uneven, p == 2)
    for r, res in enumerate(results):
        _check_ignored(res["ignored"])
        assert [rep.rank for rep in res["even"]] == [r, r]
        _check_reports(res["even"], p, seq_len)
        for rep in res["padded"]:
            assert max(rep.max_error.values()) <= TOL, rep
            padded = cost_model.bytes_per_rank(p, -(-uneven // (2 * p)) * 2 * p if rep.layout == "zigzag"
                                               else -(-uneven // p) * p, 2, 2, 8, 8)
            assert rep.bytes_forward == padded["forward"]
    if p == 4:  # positions within the cp pair, and every pair's ring equals dense attention
        assert [[rep.rank for rep in res["sub"]] for res in results] == [[0, 0], [1, 1], [0, 0], [1, 1]]
        for res in results:
            _check_reports(res["sub"], 2, 16)
            step = res["dp_cp"]  # dp x cp: the loss and the gradients of one process on the whole batch
            assert step["loss"] <= TOL and step["grads"] <= TOL, step
            assert step["members"] == [0, 1, 2, 3] and step["axes"] == {"dp_cp"}
            assert step["error"] == ("flat_group(axes=['tp']): the mesh has no axis 'tp'; its axes are "
                                     "['dp', 'cp']; name axes the mesh has")
    if p == 2:
        for res in results:
            assert all(g.worst() <= TOL for g in res["gpt"])
            assert res["memory"] == cost_model.attention_saved_bytes(2, seq_len, 1, 2, 8, 8)


def _check_ignored(verdicts: dict[str, str]) -> None:
    assert sorted(verdicts) == sorted(f"{c}/{lay}" for c in ("some", "all", "padded")
                                      for lay in ("zigzag", "contiguous"))
    for case, line in verdicts.items():
        assert line == f"{case}: loss and all 16 gradients agree within 1e-10: ok", line


def test_ignored_targets_count_as_in_cross_entropy_on_one_process() -> None:
    _check_ignored(_ignored_targets_parity())
