"""The GPU path: `make gpu-check` on a GPU node, and NCCL's rules checked on CPU.

Files:
- `rendezvous.py`: per-rank orders of messages and collectives run on paper under NCCL's semantics (a send
  waits for its receive, a pair's messages match in order, every rank calls the same collectives);
- `rules.py`: a `distlab.comm_log` that also notes each call's devices and group, and the cross-rank
  check of what ranks recorded (tensors on the rank's device, no receive from any source, same order);
- `strict.py`: a GPU node's device rule played on CPU (`strict_devices`: tensors made without `device=`
  land on meta, and a collective given a tensor off the rank's device raises, naming the call);
- `labs.py`: every lab under nbval on the node, on its GPUs and with every rank on one shared GPU, and
  each lab's cell counts read back from the JUnit XML;
- `environment.py`: what the report names (GPU, driver, CUDA, NCCL, torch);
- `bench.py`: the measurements (chapter 7's CUDA peak against its prediction, chapter 8's host-to-device
  and device-to-device bandwidth, chapter 1's busbw);
- `gemm.py`: the GEMM grid (bf16, FP8), the compiled cast and FP8 against bf16 at five sizes, fitted into
  `distlab.kernel_rates` and set beside chapter 7's FP8 cost model;
- `step.py`: the course's GPT's one-GPU step time and peak at four sizes beside chapter 9's
  `plan.kernel_time` and the single eta;
- `report.py`: pytest's outcomes read back, the verdict, and the JSON and text written to assets/gpu/;
- `__main__.py`: `python -m distlab.gpu_check`, which runs `pytest -m gpu`, the labs and the measurements
  and writes the report under assets/gpu/.
"""

from distlab.gpu_check.rendezvous import Finding, Op, check, pipeline_program

__all__ = ["Finding", "Op", "check", "pipeline_program"]
