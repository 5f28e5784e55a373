"""ZeRO-3 parameters all-gathered in FP8 (distlab.memory.fp8.allgather), on real ranks.

One launch of 4 ranks; inside it, groups of 1, 2, 3 and 4 ranks (and the dp axis of grid(dp=2, tp=2))
each gather two weights of the course's GPT sharded by rows (128 rows: uneven on 3 ranks; and a 10-row
weight with an outlier, uneven on 3 and 4) in bf16, FP8 tensorwise and FP8 rowwise, inside the
comm_log. Claims: the FP8 gather equals quantise-dequantise of the full weight bit for bit (every rank cast
its slice with the same agreed scale, or with its own rows' scales); the bf16 gather equals the bf16 cast;
the log's bytes equal `gather_bytes`, and FP8 sends half of bf16's plus the scales.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from distlab import launch, mesh, reference
from distlab.comm_log import comm_log
from distlab.memory.fp8.allgather import MODES, fp8_all_gather, gather_bytes, shard_rows
from distlab.memory.fp8.scaling import fake_quantize


def _weights() -> dict[str, torch.Tensor]:
    model = reference.gpt_task().build(0)
    w = torch.linspace(-1, 1, 10 * 24).view(10, 24)
    w[7, 3] = 40.0  # one large value: the tensorwise scale must be the whole weight's
    return {"c_fc": model.h[0].mlp.c_fc.weight.detach(), "outlier": w}


def _gather_all(group: dist.ProcessGroup | None, sizes: dict) -> dict:
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    out = {}
    for name, w in _weights().items():
        for mode in MODES:
            with comm_log() as log:
                got = fp8_all_gather(shard_rows(w, rank, p), w.shape[0], mode, group=group)
            want = {"bf16": w.to(torch.bfloat16).float(),
                    "tensorwise": fake_quantize(w, "e4m3"),
                    "rowwise": fake_quantize(w, "e4m3", (1, None))}[mode]
            out[(name, mode)] = (torch.equal(got, want), log.bytes(), log.sent_bytes(),
                                 gather_bytes(*w.shape, p, mode))
    sizes[p] = out
    return out


def _on_ranks() -> dict:
    sizes: dict = {}
    for n in (1, 2, 3):
        g = dist.new_group(list(range(n)))  # every rank takes part in making each group
        if dist.get_rank() < n:
            _gather_all(g, sizes)
    _gather_all(None, sizes)
    dp = mesh.grid(dp=2, tp=2)["dp"].get_group()
    errors = {}
    try:
        fp8_all_gather(torch.zeros(3, 4), 3, "int8", group=dp)
    except ValueError as e:
        errors["mode"] = str(e)
    return {"sizes": sizes, "dp": _gather_all(dp, {}), "errors": errors}


@functools.cache
def _ranks() -> list[dict]:
    return launch.run(_on_ranks, 4, timeout=180.0)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_fp8_gather_equals_quantise_dequantise_of_the_full_weight(p: int) -> None:
    for r in _ranks()[:p]:
        for (name, mode), (equal, logged, sent, predicted) in r["sizes"][p].items():
            assert equal, f"p={p} {name} {mode}: gathered weight differs from the cast of the full weight"
            assert logged == predicted, (p, name, mode, logged, predicted)
            if p == 1:
                assert sent == 0


def test_fp8_sends_half_of_bf16_plus_the_scales() -> None:
    r = _ranks()[0]["sizes"][4]
    rows, cols = 128, 32
    bf16, tw, rw = (r[("c_fc", m)][1] for m in MODES)
    assert bf16 == 2 * rows * cols and tw == rows * cols + 4 and rw == rows * cols + 4 * rows
    assert tw / bf16 == pytest.approx(0.5, abs=1e-3)
    assert r[("c_fc", "tensorwise")][2] < 0.51 * r[("c_fc", "bf16")][2]  # ring bytes sent by this rank


def test_mesh_axis_group_equals_a_plain_group_and_bad_mode_is_named() -> None:
    for r in _ranks():
        for key, (equal, logged, _, predicted) in r["dp"].items():
            assert equal and logged == predicted, key
        assert r["dp"].keys() == r["sizes"][4].keys()
    assert "mode='int8' is unknown; choose one of bf16, tensorwise, rowwise" in _ranks()[0]["errors"]["mode"]
