"""The course's one model shape, `distlab.model_shape.ModelShape` (issue 36.2): its conversions to and from
`GPTConfig`, its checks, and the parameter count that chapter 7's estimator, chapter 9's planner, chapter
12's dry run and `make gpu-check`'s blocks all take from it, so that they cannot disagree."""

from __future__ import annotations

import pytest
import torch

from distlab.dryrun.layouts import estimator_config, from_published
from distlab.gpu_check.block import BlockShape, _weights
from distlab.memory.estimate.config import MemoryConfig, total_params
from distlab.memory.estimate.cost_model import gpt_num_params
from distlab.memory.estimate.estimator import estimate
from distlab.memory.estimate.gpt_ends import gpt_parameter_sizes
from distlab.model_shape import ModelShape
from distlab.models import GPT, GPTConfig
from distlab.plan.inputs import PRESETS, ModelSpec
from distlab.plan.published import lookup

SHAPES = {
    "gpt-block": ModelShape(layers=4, hidden=256, heads=8, vocab=1024, seq=512),
    "gqa-swiglu-untied": ModelShape(layers=6, hidden=512, heads=8, vocab=3000, seq=256, kv_heads=2, ffn=1376,
                                    gated=True, tied=False, positions=False),
    "llama3-405b": PRESETS["llama3-405b"].model_shape,
    "bloom-176b": PRESETS["bloom-176b"].model_shape,
}


def _spec(s: ModelShape) -> ModelSpec:
    return ModelSpec(s.layers, s.hidden, s.heads, s.vocab, s.seq, kv_heads=s.kv_heads, ffn=s.ffn,
                     gated=s.gated, tied=s.tied, positions=s.positions)


@pytest.mark.parametrize("name", list(SHAPES))
def test_estimator_planner_and_step_replay_count_the_same_parameters(name):
    shape = SHAPES[name]
    config = MemoryConfig.of(shape)
    assert total_params(config) == shape.params
    assert estimate(config).n_params == shape.params
    assert _spec(shape).params == shape.params and _spec(shape).model_shape == shape
    kv = shape.kv_width if shape.kv_heads is not None else None
    sizes = gpt_parameter_sizes(shape.layers, shape.hidden, shape.vocab, shape.seq, True, 1, kv, shape.ffn,
                                shape.gated, tied=shape.tied, positions=shape.positions)
    assert sum(sizes) == shape.params  # the tensors the peak replays are the count's


@pytest.mark.parametrize("bias", [True, False])
def test_the_course_gpt_has_exactly_the_count(bias):
    config = GPTConfig(vocab_size=97, block_size=24, n_layer=3, n_head=4, n_embd=32, bias=bias)
    shape = ModelShape.from_gpt_config(config)
    assert shape.to_gpt_config() == config
    assert sum(p.numel() for p in GPT(config).parameters()) == shape.params
    assert gpt_num_params(3, 32, 97, 24, bias) == shape.params


def test_the_dry_run_trains_the_count_its_estimate_uses():
    run = lookup("llama3-405b-8k")
    layout = from_published(run.name, layers=run.pp)  # its shape in the course's GPT block, one block a stage
    with torch.device("meta"):
        numel = sum(p.numel() for p in GPT(layout.config).parameters())
    assert numel == layout.model_shape.params == total_params(estimator_config(layout))
    padded = -(-128000 // run.tp) * run.tp  # the vocabulary padded to a multiple of tp
    assert layout.model_shape == ModelShape(layers=run.pp, hidden=16384, heads=128, vocab=padded, seq=8192)


@pytest.mark.parametrize("tp", [1, 2])
def test_gpu_checks_block_holds_the_block_weights(tp):
    block = BlockShape("small", 64, 8, 2, 160, True, 16, 1, tp)
    held = _weights(block, torch.device("cpu"), torch.float32)
    matrices = sum(held[k].numel() for k in ("qkv", "proj", "up", "down"))
    shape = ModelShape(layers=1, hidden=64, heads=8, vocab=1, seq=16, kv_heads=2, ffn=160, gated=True)
    assert matrices * tp == shape.block_weights


def test_a_modern_shape_runs_in_gpt_only_through_its_gpt_block():
    shape = SHAPES["gqa-swiglu-untied"]
    with pytest.raises(ValueError, match="convert shape.in_gpt_block"):
        shape.to_gpt_config()
    gpt = shape.in_gpt_block().to_gpt_config(dropout=0.1)
    assert (gpt.n_layer, gpt.n_embd, gpt.n_head, gpt.vocab_size, gpt.block_size, gpt.dropout) == \
        (6, 512, 8, 3000, 256, 0.1)


@pytest.mark.parametrize(("sizes", "message"), [
    ({"hidden": 0}, "hidden=0 must be a positive integer"),
    ({"heads": 3}, "hidden=256 is not divisible by heads=3"),
    ({"kv_heads": 3}, "kv_heads=3 must be a positive integer that divides heads=8"),
    ({"ffn": -1}, "ffn=-1 must be a positive integer"),
    ({"layers": True}, "layers=True must be a positive integer"),
])
def test_bad_sizes_are_named(sizes, message):
    base = dict(layers=4, hidden=256, heads=8, vocab=1024, seq=512)
    with pytest.raises(ValueError, match=message):
        ModelShape(**(base | sizes))


def test_a_gpt3_block_is_12_h_squared_and_13_h():
    s = ModelShape(layers=96, hidden=12288, heads=96, vocab=50257, seq=2048)
    assert (s.block_weights, s.block_biases, s.modern) == (12 * 12288**2, 13 * 12288, False)
    assert s.params == PRESETS["gpt3-175b"].params
