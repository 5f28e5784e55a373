"""Chapter 7, the estimate: bytes per GPU of any training configuration, predicted without running it.

- `cost_model`: the closed forms: bytes per parameter (ZeRO's 2 + 2 + K), ZeRO's Table 1, Korthikanti et
  al.'s per-layer activations term by term, the course GPT's exact count, Chen et al.'s sqrt(n) segments.
- `shape`: how a pipeline splits the blocks, and a real block's saved tensors; the block's shape and its
  counts are the course's one `distlab.model_shape.ModelShape` (`MemoryConfig.model_shape`).
- `config`: `MemoryConfig`, one configuration (model, layout, ZeRO, precision, recomputation, offload),
  and `validate`.
- `model_states` (per GPU) and `activations` (per layer, per stage): the estimator's two terms.
- `estimator`: `estimate(MemoryConfig(...))`, bytes per GPU of any configuration (dp, tp, pp with
  1F1B/GPipe/interleaved, cp, ZeRO 0-3, recomputation, offload, precision); `python -m distlab.memory
  estimate ... --json`.
- `peak_layout`: the peak of a step on the GPU of any layout that holds the most (`layout_peak`,
  `stage_peak`), the estimator's `peak_bytes`: the one memory number, which chapter 9's planner uses.
  It replays `gpt_step` (a block's ops and their tensors), `gpt_ends` (the embedding, the output layer
  and the loss) and `optimizer_step` (Adam's for-loop, foreach and fused forms) on a `timeline.Timeline`
  (live bytes by kind).
- `moe_states`, `moe_activations`: a mixture of experts (`ModelShape(moe=...)`) under parallel folding:
  model states per rank over dp and edp, dispatch buffers, and an approximate peak of every pipeline
  stage (`moe_stage_peaks`, the last with its head; MLA included), within 1 % of chapter 12's dry run of
  a whole stage;
  `moe_savings`, DeepSeek-V3's recomputation and FP8 activation caching as options of that peak;
  `moe_block_activations`, every tensor chapter 6's folded block saves on a rank, from its measured
  routing (equal to the bytes the block saves, byte for byte); `moe_step_peak`, the peak of one training
  step of that block on a rank, tensor by tensor (`moe_step_ops`: forward and sizes, `moe_step_backward`:
  autograd's order), against `measure.moe_step`'s measured step.
"""
