"""Chapter 7, the techniques: the ways to need fewer bytes (ZeRO is `distlab.memory.zero`, FP8
`distlab.memory.fp8`).

- `precision`: mixed precision from scratch: `LossScaler` (static and dynamic), `unscale_`,
  `MasterWeights` (fp32 weight backup), the check against `torch.amp.GradScaler`, the underflow and
  accumulation demos, and `require_dtype` (a device that cannot compute in fp16 or bf16).
- `recompute`: activation recomputation (none, the attention core, the MLP, whole blocks, sqrt(n)
  segments) with bitwise-equal gradients, `plan_for_budget` (the cost-aware policy) and
  `time_recompute` (the time overhead against one extra forward).
- `accumulation`: gradient accumulation with chapter 2's `no_sync` (its measured memory is
  `measure.accumulation_peak`).
- `compression`: a memory-efficient optimizer (Adafactor) and the comparison of gradient compression
  (chapter 2's `data_parallel.powersgd`, ours and PyTorch's) on the chapter's task.
"""
