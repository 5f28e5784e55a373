"""Chapter 7, the measurement: the bytes of a training step counted on a device, beside their prediction.

- `accounting`: the instruments, exact on any device (CPU included): `saved_activation_bytes`
  (saved-tensor hooks, each storage once), `LiveBytes` (a dispatch mode that tracks live storages and
  the peak), `measure_step` -> `StepMemory`, `cuda_peak_check` against `torch.cuda.max_memory_allocated`;
  and `measure_gpt_step`, one step of the course's GPT measured.
- `peak`: `predict_peak`, the same GPT step's peak tensor by tensor (which phase, which tensors are alive),
  beside `measure_gpt_step`; `python -m distlab.memory measure --json` prints both.
- `peak_zero`, `peak_pipeline`: the peak of a ZeRO step on each rank and of a pipelined step on each
  stage, predicted tensor by tensor and measured.
- `accumulation_peak`: the peak of a step accumulated over micro-batches, measured.
- `moe_step`: one training step of chapter 6's folded MoE block measured on each gloo rank
  (`SettledLiveBytes`: the same peak in every run), beside `estimate.moe_step_peak`'s prediction.
"""
