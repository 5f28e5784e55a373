"""The peak of one training step on the GPU of a layout that holds the most: the estimator's one memory
number, which the planner (chapter 9) uses too.

`predict_peak` follows the course's GPT on one process tensor by tensor. `layout_peak(c)` follows the same
inventory (`gpt_step`, `gpt_ends`, `optimizer_step`) on one GPU of any configuration the estimator takes,
pipeline stage by pipeline stage, and keeps the largest:

- the stage's parameters, sized by tensor parallelism (`gpt_ends.gpt_parameter_sizes`), and their model
  states 2 + 2 + K or 4 + 4 + 8 bytes each, divided by ZeRO's stage over the dp ranks (Rajbhandari et al.
  2020, sec. 5); under ZeRO-3 the gathered parameters of the block at work and of the next one (prefetched);
- the activations of the micro-batches the stage holds besides the one it works on: all m under GPipe,
  p - stage under 1F1B, the interleaved schedule's count (`shape.in_flight`; Narayanan et al. 2021,
  sec. 2.2), each the stage's blocks' saved tensors (and the embedding's on the first stage);
- with m > 1 micro-batches the gradients of the earlier ones, accumulated (sharded under ZeRO-2 and 3);
  then each block's gradients are temporaries added into them;
- one micro-batch's forward and backward tensor by tensor, sized per GPU by t, sp and cp (`StepShape`);
  every block is identical, so one block's forward and backward are walked once and repeated
  (`Timeline.repeat`, exact: the total after k blocks is k times one block's change);
- the optimizer's step: the fp32 master gradients and Adam's scratch in the implementation that runs
  (`optimizer_step`), on the dp shard under ZeRO; nothing on the GPU with offload.

For one GPU (t = p = c = d = 1, m = 1) this is `predict_peak` to the byte
(`tests/memory/test_memory_layout.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from distlab.memory.estimate import cost_model, shape
from distlab.memory.estimate.config import MemoryConfig, total_params, validate
from distlab.memory.estimate.gpt_ends import (
    block_parameter_sizes,
    embedding_backward,
    embedding_forward,
    gpt_parameter_sizes,
    head_backward,
    head_forward,
)
from distlab.memory.estimate.gpt_step import StepShape, block_backward, block_forward
from distlab.memory.estimate.optimizer_step import adam_form, adam_step, master_step
from distlab.memory.estimate.timeline import Timeline

OPTIONS = {"none": "none", "selective": "core", "full": "block"}  # recompute policy -> per-block option


@dataclass(frozen=True)
class LayoutPeak:
    """The peak bytes of one step on the GPU that holds the most, its phase, the op and the stage."""

    peak_bytes: float
    phase: str
    where: str
    stage: int


def step_shape(c: MemoryConfig, bias: bool = True) -> StepShape:
    """One GPU's share of a micro-batch's tensors (`gpt_step.StepShape`) for configuration `c`."""
    s = c.seq // c.cp
    return StepShape(c.micro_batch * s, s, c.hidden, c.heads, c.vocab, 2 if c.precision == "mixed" else 4,
                     bias, c.tp, c.tp if c.sequence_parallel else 1,
                     c.model_shape.kv_width, c.ffn, c.gated, c.attention == "math",
                     c.dropout, c.fp8, c.tied, c.positions)


@dataclass(frozen=True)
class _Block:
    """One block's forward and backward, walked once: what each adds and how far above its start it rises."""

    saved: int  # bytes a block's forward leaves (its saved tensors and its output)
    forward_rise: int
    forward_where: str
    backward_net: int  # what a block's backward changes the total by
    backward_rise: int
    backward_where: str


def _walk_block(sh: StepShape, option: str, grads: str) -> _Block:
    tl = Timeline()
    tl.alloc("x0", sh.nh, "activations")
    base = tl.current
    tl.restart_peak()
    block_forward(tl, 0, sh, option)
    saved, f_rise, f_where = tl.current - base, tl.peak - base, tl.peak_where
    tl.free("x1")
    tl.alloc("d.x1", sh.nh)
    base = tl.current
    tl.restart_peak()
    block_backward(tl, 0, sh, option, grads)
    return _Block(saved, f_rise, f_where, tl.current - base, tl.peak - base, tl.peak_where)


def _states(tl: Timeline, c: MemoryConfig, sizes: list[float]) -> None:
    w, g, k = cost_model.check_precision(c.precision)
    n = sum(sizes)
    tl.alloc("params", w * n / (c.dp if c.zero >= 3 else 1), "params")
    if not c.offload:
        tl.alloc("optimizer state", k * n / (c.dp if c.zero >= 1 else 1) + 4 * len(sizes), "optimizer")


def _head_saved(sh: StepShape) -> int:
    """What the final LayerNorm, the output layer and the loss keep for the backward (one micro-batch)."""
    tl = Timeline()
    head_forward(tl, sh)
    return tl.current


def _stage_peak(c: MemoryConfig, sh: StepShape, block: _Block, stage: int, layers: int, scale: float,
                held: float | None = None) -> Timeline:
    """The timeline of one micro-batch through stage `stage` and the optimizer's step after it, with `held`
    other micro-batches' activations (None: the schedule's count, `shape.in_flight` - 1)."""
    first, last = stage == 0, stage == c.pp - 1
    m = c.microbatches or c.pp
    accumulate = m > 1
    sizes = _stage_sizes(c, sh, layers, first, last, scale)
    g_bytes = cost_model.check_precision(c.precision)[1] * sum(sizes) / (c.dp if c.zero >= 2 else 1)
    grads = "temporaries" if (accumulate or c.zero >= 2) else "grads"
    tl = Timeline()
    _stage_states(tl, c, sh, sizes, scale, g_bytes if accumulate else None)
    if held is None:
        held = shape.in_flight(c.schedule, stage, c.pp, m, c.interleave, c.rounds) - 1
    _hold_others(tl, c, sh, block, layers, first, last, held)
    _stage_forward(tl, sh, block, layers, first)
    tied_here = c.tied and first
    _head_or_send(tl, sh, layers, last, tied_here, grads)
    if c.zero >= 2 and not accumulate:
        tl.alloc("sharded grads", g_bytes, "grads")
    _blocks_backward(tl, sh, block, layers, grads)
    if first:
        embedding_backward(tl, sh, tied_here, grads)
    tl.free("d.x0", "gathered blocks", "other micro-batches")  # every micro-batch is done by the step
    tl.phase = "optimizer"
    if not c.offload:
        _optimizer_step(tl, c, sizes)
    return tl


def _stage_sizes(c: MemoryConfig, sh: StepShape, layers: int, first: bool, last: bool,
                 scale: float) -> list[float]:
    """The stage's parameter tensors' sizes (elements), scaled by `scale`."""
    return [x * scale for x in gpt_parameter_sizes(layers, c.hidden, c.vocab, c.seq, True, c.tp, sh.kv,
                                                   c.ffn, c.gated, first, last, c.tied, c.positions)]


def _head_or_send(tl: Timeline, sh: StepShape, layers: int, last: bool, tied_here: bool, grads: str) -> None:
    """The head's forward and backward on the last stage; elsewhere, the output sent on, its gradient back."""
    if last:
        head_forward(tl, sh)
        head_backward(tl, sh, f"x{layers}", tied_here, grads)
    else:
        tl.phase = "backward"
        tl.free(f"x{layers}")  # sent to the next stage
        tl.alloc(f"d.x{layers}", sh.nh)  # the gradient received from it


def _stage_states(tl: Timeline, c: MemoryConfig, sh: StepShape, sizes: list[float], scale: float,
                  accumulated: float | None) -> None:
    """The model states, the gathered blocks under ZeRO-3 and the accumulated gradients (None: none)."""
    _states(tl, c, sizes)
    if c.zero == 3 and c.dp > 1:  # the block at work and the prefetched next one, gathered
        tl.alloc("gathered blocks", 2 * sh.e * sum(block_parameter_sizes(c.hidden, True, c.tp, sh.kv, c.ffn,
                                                                         c.gated)) * scale)
    if accumulated is not None:
        tl.alloc("accumulated grads", accumulated, "grads")


def _hold_others(tl: Timeline, c: MemoryConfig, sh: StepShape, block: _Block, layers: int, first: bool,
                 last: bool, held: float) -> None:
    """The activations that `held` other micro-batches keep on this stage while this one runs."""
    # a held micro-batch: its blocks' saved tensors and the stage's input, less its output where it is sent
    # on (and freed, as Megatron-LM's deallocate_output_tensor does); the position ids on the first stage,
    # the head's saved tensors on the last
    stash = layers * block.saved + (8 * sh.s if (first and c.positions) else 0)
    if last:
        stash += sh.nh + _head_saved(sh)
    tl.alloc("other micro-batches", held * stash, "activations")


def _stage_forward(tl: Timeline, sh: StepShape, block: _Block, layers: int, first: bool) -> None:
    """The stage's input and its blocks' forward passes, up to the last block's output."""
    if first:
        embedding_forward(tl, sh)
    else:
        tl.alloc("x0", sh.nh, "activations")  # the input received from the previous stage
    tl.repeat("blocks (saved)", layers, block.saved, block.forward_rise,
              block.forward_where.replace("layer 0", "layer {}"), "activations")
    tl.alive["blocks (saved)"] = ("activations", tl.alive["blocks (saved)"][1] - int(sh.nh))
    tl.current -= int(sh.nh)
    tl.alloc(f"x{layers}", sh.nh, "activations")  # the last block's output, named for the head


def _blocks_backward(tl: Timeline, sh: StepShape, block: _Block, layers: int, grads: str) -> None:
    """The blocks' backward passes, leaving the input's gradient and the blocks' gradients alive."""
    back = block.backward_where.replace("layer 0", "layer {}")
    tl.repeat("blocks (saved)", layers, block.backward_net, block.backward_rise, back, "activations",
              reverse=True)
    rest = tl.alive.pop("blocks (saved)")[1] + tl.alive.pop("x0")[1] + tl.alive.pop(f"d.x{layers}")[1]
    tl.alive["d.x0"] = ("temporaries", int(sh.nh))
    if rest > sh.nh:
        tl.alive["block grads"] = (grads, rest - int(sh.nh))


def _optimizer_step(tl: Timeline, c: MemoryConfig, sizes: list[float]) -> None:
    """The optimizer's step on this rank's shard of the stage's parameters."""
    shard = [x / (c.dp if c.zero >= 1 else 1) for x in sizes]
    form = adam_form(c.adam, c.device)
    adam_step(tl, shard, form, 4) if c.precision == "fp32" else master_step(tl, shard, form)


def stage_peak(c: MemoryConfig, stage: int, held: float | None = None, bias: bool = True) -> LayoutPeak:
    """The peak of pipeline stage `stage` alone, holding `held` other micro-batches' activations (None: as
    its schedule does). With pp = 1 and `held` = k - 1 it is one process that runs k forwards, then k
    backwards (GPipe's order on a single stage)."""
    validate(c)
    sh = step_shape(c, bias)
    layers = shape.stage_layers(c.layers, c.pp, c.layer_split)[stage]
    block = _walk_block(sh, OPTIONS[c.recompute], _grads_kind(c))
    tl = _stage_peak(c, sh, block, stage, layers, _scale(c), held)
    return LayoutPeak(tl.peak, tl.peak_phase, tl.peak_where, stage)


def _grads_kind(c: MemoryConfig) -> str:
    """Gradients that stay (one micro-batch, no sharding), or temporaries added into accumulated or
    sharded ones."""
    return "temporaries" if ((c.microbatches or c.pp) > 1 or c.zero >= 2) else "grads"


def _scale(c: MemoryConfig) -> float:
    """`c.params` over the shape's own count (1 without `params`): the model states follow `params`."""
    return 1.0 if c.params is None else c.params / total_params(replace(c, params=None))


def layout_peak(c: MemoryConfig, bias: bool = True) -> LayoutPeak:
    """The peak of one step on the GPU that holds the most (module docstring); `c` needs the shape."""
    sh = step_shape(c, bias)
    scale = _scale(c)
    block = _walk_block(sh, OPTIONS[c.recompute], _grads_kind(c))
    best: LayoutPeak | None = None
    for stage, layers in enumerate(shape.stage_layers(c.layers, c.pp, c.layer_split)):
        tl = _stage_peak(c, sh, block, stage, layers, scale)
        if best is None or tl.peak > best.peak_bytes:
            best = LayoutPeak(tl.peak, tl.peak_phase, tl.peak_where, stage)
    assert best is not None
    return best
