"""The measurements of `make gpu-check`: memory against chapter 7's prediction, and chapters 1 and 8's
bandwidths, each a list of plain dicts for the report.

- `memory_check`: one training step of `distlab.models.GPT` with Adam on the GPU, its peak from
  `torch.cuda.max_memory_allocated`, beside `memory.peak.predict_peak` (which counts every tensor of the
  step: parameters, gradients, optimizer state, saved activations, temporaries; Rajbhandari et al. 2020;
  Korthikanti et al. 2022). The allocator also holds what is not the step's (the batch, cuBLAS's
  workspace): measured before the step and taken out, so the comparison is of the step alone. The
  caching allocator rounds each block up to 512 bytes, and the shapes are large enough for that to stay
  far below the tolerance.
- `bandwidth`: host-to-device and device-to-host (pinned, pageable), device-to-device and GPU-to-GPU, as
  chapter 8 measures them (`distlab.hardware.bench.gpu_results`, NVIDIA's bandwidthTest conventions).
- `busbw`: chapter 1's nccl-tests-style all_reduce bus bandwidth over every GPU on NCCL
  (`distlab.hardware.bench.collective`; busbw = algbw x 2(p-1)/p, nccl-tests' PERFORMANCE.md).
"""

from __future__ import annotations

from dataclasses import asdict

import torch

# (layers, hidden, heads, batch, seq, vocab): large enough that 512-byte rounding is far below 1 %
SHAPES = ((2, 256, 4, 4, 128, 512), (4, 512, 8, 2, 256, 1024))
CASES = (("fp32", "none"), ("fp32", "full"), ("mixed", "none"), ("mixed", "selective"))
MEMORY_TOLERANCE = 0.05  # chapter 7's stated goal for the predicted peak (tests/memory/test_memory_peak.py)


def cuda_step_peak(layers: int, hidden: int, heads: int, batch: int, seq: int, vocab: int,
                   precision: str = "fp32", recompute: str = "none", device: int = 0,
                   adam: str = "for-loop") -> dict:
    """One step on CUDA GPU `device`, as `memory.accounting.measure_gpt_step` runs it on CPU: the bytes
    the step itself allocated at its peak (max_memory_allocated less what was allocated before it and is
    not a model state), and the prediction for the same shape. `adam`: Adam's implementation ("for-loop",
    "foreach", "fused", or "default", torch's choice on CUDA: foreach; `memory.optimizer_step`), run and
    predicted alike."""
    from distlab.memory.estimate.estimator import MemoryConfig
    from distlab.memory.estimate.optimizer_step import adam_form, adam_kwargs
    from distlab.memory.measure.accounting import optimizer_tensors
    from distlab.memory.measure.peak import predict_peak
    from distlab.memory.techniques.precision import MasterWeights
    from distlab.memory.techniques.recompute import policy_plan, recompute_forward
    from distlab.models import GPT, GPTConfig

    dev = torch.device("cuda", device)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=seq, n_layer=layers, n_head=heads, n_embd=hidden,
                          bias=True)).to(dev)
    g = torch.Generator().manual_seed(0)
    idx, y = (torch.randint(vocab, (batch, seq), generator=g).to(dev) for _ in range(2))
    plan = policy_plan(recompute, layers)
    form = adam_form(adam, "cuda")
    if precision == "mixed":
        model = model.to(torch.bfloat16)
        optimizer = MasterWeights(model, lambda ps: torch.optim.Adam(ps, lr=1e-3, **adam_kwargs(form)))
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **adam_kwargs(form))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        recompute_forward(model, idx, y, plan=plan)[1].backward()
        optimizer.step()

    step()  # the optimizer's state and cuBLAS's workspace now exist
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize(dev)
    states = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
              for t in [*model.parameters(), *optimizer_tensors(optimizer)] if t.is_cuda}
    other = torch.cuda.memory_allocated(dev) - sum(states.values())
    torch.cuda.reset_peak_memory_stats(dev)
    step()
    torch.cuda.synchronize(dev)
    measured = torch.cuda.max_memory_allocated(dev) - other
    config = MemoryConfig(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq, micro_batch=batch,
                          precision=precision, recompute=recompute, attention="flash", dropout=False,
                          adam=form, device="cuda")
    predicted = predict_peak(config, bias=True)
    return {"shape": {"layers": layers, "hidden": hidden, "heads": heads, "batch": batch, "seq": seq,
                      "vocab": vocab}, "precision": precision, "recompute": recompute, "adam": form,
            "measured_peak_bytes": int(measured), "predicted_peak_bytes": int(predicted.peak_bytes),
            "predicted_phase": predicted.phase, "not_the_step_bytes": int(other),
            "relative_error": predicted.peak_bytes / measured - 1}


def memory_check(tolerance: float = MEMORY_TOLERANCE, adam: str = "for-loop") -> list[dict]:
    """`cuda_step_peak` for every shape and case with Adam's implementation `adam`; each row says whether it
    is within `tolerance`."""
    rows = []
    for shape in SHAPES:
        for precision, recompute in CASES:
            row = cuda_step_peak(*shape, precision=precision, recompute=recompute, adam=adam)
            row["tolerance"] = tolerance
            row["within_tolerance"] = abs(row["relative_error"]) <= tolerance
            rows.append(row)
    return rows


def bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> list[dict]:
    """Chapter 8's copies on this node: H2D and D2H (pinned, pageable), D2D, and P2P per GPU pair."""
    from distlab.hardware.bench import gpu_results

    return [asdict(r) | {"percent_of_spec": r.percent_of_spec} for r in gpu_results(nbytes, repeats)]


def busbw(repeats: int = 5) -> dict:
    """Chapter 1's all_reduce bus bandwidth on NCCL over every GPU (one rank per GPU); with one GPU
    there is no bus (busbw's factor 2(p-1)/p is 0), and the row says so."""
    from distlab.hardware.bench import collective

    n = torch.cuda.device_count()
    if n < 2:
        return {"test": "all_reduce busbw", "measured_GBps": None,
                "note": f"skipped: {n} GPU visible; a bus bandwidth needs at least 2 ranks"}
    r = collective(world_size=n, size="1M:256M:4", repeats=repeats, backend="nccl")
    return asdict(r) | {"percent_of_spec": r.percent_of_spec}
