"""The GPU path: `make gpu-check` on a GPU node, and NCCL's rules checked on CPU.

Files:
- `rendezvous.py`: per-rank orders of messages and collectives run on paper under NCCL's semantics (a send
  waits for its receive, a pair's messages match in order, every rank calls the same collectives);
- `rules.py`: a `distlab.comm_log` that also notes each call's devices and group, and the cross-rank
  check of what ranks recorded (tensors on the rank's device, no receive from any source, same order);
- `environment.py`: what the report names (GPU, driver, CUDA, NCCL, torch);
- `measure.py`: the measurements (busbw, host-to-device and device-to-device bandwidth, memory);
- `__main__.py`: `python -m distlab.gpu_check`, which runs `pytest -m gpu` and the measurements and
  writes the report under assets/gpu/.
"""

from distlab.gpu_check.rendezvous import Finding, Op, check, pipeline_program

__all__ = ["Finding", "Op", "check", "pipeline_program"]
