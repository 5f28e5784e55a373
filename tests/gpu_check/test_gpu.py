"""The GPU path: every chapter's public code on CUDA, run by `make gpu-check` (or `pytest -m gpu`).

Every test here is marked `gpu` and skipped where `torch.cuda.is_available()` is False, so CI on CPU
skips them all. On a GPU node:
- every chapter at world size 1 on NCCL, and at as many ranks as there are GPUs (one GPU per rank,
  `launch.resolve_backend`'s rule): collectives, data parallelism, pipeline, tensor parallelism, MoE,
  ZeRO (ShardedOptimizer, and the ZeRO engine with offload: pinned host memory and a side stream), 3D,
  context parallelism and sharded checkpoints, each against its single-process reference; inside
  `distlab.gpu_check.rules.RuleLog`, so that every collective is also checked for NCCL's rules;
- gloo over CUDA tensors (2 ranks), for the collectives gloo runs on GPUs (all_reduce, broadcast);
- chapter 7's measured peak (`torch.cuda.max_memory_allocated`) against `memory.peak.predict_peak`.
The measurements (busbw, host-to-device and device-to-device bandwidth) are in `distlab.gpu_check.bench`.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from distlab import launch

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]


def _cpu(x: object) -> object:
    """Results leave a rank on the CPU: the launcher's side compares them with CPU references."""
    import dataclasses

    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: _cpu(getattr(x, f.name)) for f in dataclasses.fields(x)
                                         if f.init})
    return x


def _plan_3d(p: int):
    from distlab.parallel3d import Plan3D

    tp = 2 if p % 2 == 0 else 1
    pp = 2 if (p // tp) % 2 == 0 else 1
    dp = p // (tp * pp)
    return Plan3D(dp=dp, pp=pp, tp=tp, m=2 * pp, schedule="1f1b", zero_stage=1 if dp > 1 else 0)


def _checks(p: int, dev: torch.device, root: str) -> dict:
    """The chapters' checks on this rank: name -> a function returning (passed, verdict) or raw results
    that the launcher's side compares (pipeline, 3D)."""
    from distlab.collectives import ring_all_reduce
    from distlab.context_parallel.parity import attention_parity, gpt_parity
    from distlab.data_parallel import parameters_parity, train_data_parallel, train_single_process
    from distlab.mesh import grid
    from distlab.models import GPTConfig
    from distlab.moe.parity import ParityCase, parity_one
    from distlab.parallel3d import make_batches, train_3d
    from distlab.pipeline.train import steps_on_rank
    from distlab.reference import mlp_task
    from distlab.tensor_parallel import compare_with_dense

    r = launch.rank()
    task = mlp_task(sizes=(8, 16, 4), n=48)

    def collectives():
        x = torch.arange(7.0, device=dev) + r
        want = x.clone()
        dist.all_reduce(want)
        got = ring_all_reduce(x)
        return bool(torch.equal(got, want)), f"ring all-reduce of 7 floats on {p} GPUs equals dist.all_reduce"

    def data_parallel():
        ours = train_data_parallel(task, "overlapped", steps=3, global_batch=24)
        rep = parameters_parity({k: v.cpu() for k, v in ours.items()},
                                train_single_process(task, steps=3, global_batch=24), label=f"p = {p}")
        return rep.passed, rep.verdict()

    def tensor_parallel():
        config = GPTConfig(vocab_size=4 * p, block_size=8, n_layer=2, n_head=p, n_embd=8 * p)
        rep = compare_with_dense(config, batch=2, seq=8, device=dev)
        return rep.passed, rep.verdict()

    def moe():
        rep = parity_one(ParityCase([3 + (2 * i) % 5 for i in range(p)], num_experts=2 * p, k=2))
        return rep.passed, rep.verdict()

    def context_parallel():
        a, g = attention_parity(seq_len=4 * p, group=None), gpt_parity(seq_len=4 * p)
        return a.passed and g.passed, f"{a.verdict()}; {g.verdict()}"

    def zero():
        return _zero_with_offload(task, dev, p, r)

    def pipeline():
        sizes = [8] + [16] * (2 * p) + [4]
        g = torch.Generator().manual_seed(3)
        X, y = torch.randn(4 * p, 8, generator=g), torch.randn(4 * p, 4, generator=g)
        return steps_on_rank([("1f1b", 2 * p, 1), ("interleaved", 2 * p, 2)], sizes, X, y)

    def pipeline_gpt():  # the tied embedding's two partial gradients summed across the first and last stage
        from distlab.pipeline.gpt import gpt_pipeline_step
        from distlab.pipeline.schedules import make_schedule

        config, idx, targets = _gpt_pipeline_problem(p)
        schedule = make_schedule("1f1b", p, 2 * p, 1, rendezvous_safe=True)
        return [gpt_pipeline_step(config, idx, targets, schedule, device=dev)]

    def three_d():
        plan = _plan_3d(p)
        config = GPTConfig(vocab_size=16, block_size=8, n_layer=2 * plan.pp, n_head=4, n_embd=16)
        batches = make_batches(config, 4 * plan.dp, 8, 2)
        return train_3d(grid(dp=plan.dp, pp=plan.pp, tp=plan.tp), config, plan, batches, device=dev)

    def checkpoints():
        return _checkpoint_resume(p, dev, root)

    return {"collectives": collectives, "data_parallel": data_parallel, "tensor_parallel": tensor_parallel,
            "moe": moe, "context_parallel": context_parallel, "zero": zero, "pipeline": pipeline,
            "pipeline_gpt": pipeline_gpt,
            "3d": three_d, "checkpoints": checkpoints}


def _gpt_pipeline_problem(p: int):
    """A GPT of 2p blocks (one per stage of a p-stage pipeline, plus room for uneven cuts) and its batch."""
    from distlab.models import GPTConfig

    config = GPTConfig(vocab_size=16, block_size=8, n_layer=2 * p, n_head=2, n_embd=8, dropout=0.0)
    g = torch.Generator().manual_seed(5)
    idx, targets = (torch.randint(16, (4 * p, 8), generator=g) for _ in range(2))
    return config, idx, targets


def _zero_with_offload(task, dev: torch.device, p: int, r: int) -> tuple[bool, str]:
    """ShardedOptimizer (stage 2, float64) and the ZeRO engine with offload (pinned host state, side
    stream; its host master copy is float32, as in Ren et al. 2021, so float32 here) against
    torch.optim.AdamW / Adam on one process's whole batch."""
    from distlab.memory.zero import ShardedOptimizer, ZeRO
    from distlab.parity import compare

    mine = slice(8 * r, 8 * (r + 1))
    reports = []
    for how, dtype in (("sharded", torch.float64), ("offload", torch.float32)):
        X, y = task.inputs[:8 * p].to(dev, dtype), task.targets[:8 * p].to(dev, dtype)
        model, ref = task.build(0).to(dev, dtype), task.build(0).to(dev, dtype)
        ref_opt = (torch.optim.AdamW(ref.parameters(), lr=1e-2) if how == "sharded"
                   else torch.optim.Adam(ref.parameters(), lr=1e-2))
        opt = (ShardedOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-2) if how == "sharded"
               else ZeRO(model, 2, lr=1e-2, offload=True))
        for _ in range(3):
            task.loss(model, X[mine], y[mine]).backward()
            opt.step()
            opt.zero_grad()
            task.loss(ref, X, y).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        ours = opt.full_parameters() if how == "offload" else dict(model.named_parameters())
        reports.append(compare({n: t.detach().cpu() for n, t in ours.items()},
                               {n: t.detach().cpu() for n, t in ref.named_parameters()}, dtype=dtype,
                               label=f"{how} ZeRO on {p} GPUs", against="one process"))
    return all(rep.passed for rep in reports), "; ".join(rep.verdict() for rep in reports)


def _checkpoint_resume(p: int, dev: torch.device, root: str) -> tuple[bool, str]:
    """Chapter 9's sharded checkpoint on CUDA: train 2 steps, save, load into a fresh trainer, train 2
    more; the losses equal one process's (float64)."""
    from distlab.mesh import grid
    from distlab.parallel3d import checkpoint
    from distlab.parallel3d.checkpoint.train import TrainConfig, Trainer, reference_losses

    tp = math.gcd(p, 4)
    cfg = TrainConfig()
    if cfg.batch_size % (p // tp):
        return True, f"not run: {p} ranks do not split the checkpoint runs' batch of {cfg.batch_size}"
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        m = grid(dp=p // tp, tp=tp)
        first = Trainer(cfg, m, device=dev)
        losses = [first.train_step() for _ in range(2)]
        checkpoint.save(first, m, f"{root}/step2")
        resumed = Trainer(cfg, m, device=dev)
        checkpoint.load(resumed, m, f"{root}/step2")
        losses += [resumed.train_step() for _ in range(2)]
        want = reference_losses(cfg, 4)
    finally:
        torch.set_default_dtype(before)
    worst = max(abs(a - b) for a, b in zip(losses, want, strict=True))
    same = "equal" if worst <= 1e-10 else "DIFFER from"
    return worst <= 1e-10, (f"save at step 2 and resume on {p} GPUs: 4 losses {same} one process's within "
                            f"1e-10 (largest difference {worst:.1e})")


def _every_chapter(root: str) -> dict:
    """On each rank (NCCL, one GPU each): every chapter's check inside a RuleLog; results on the CPU."""
    from distlab.gpu_check.rules import rule_log

    p, dev = launch.world_size(), launch.device()
    assert launch.backend() == "nccl" and dev.type == "cuda", (launch.backend(), dev)
    out: dict = {}
    for name, check in _checks(p, dev, root).items():
        with rule_log() as log:
            try:
                result = check()
            except Exception as e:  # one chapter's failure must not hide the others'
                result = (False, f"raised {type(e).__name__}: {e}")
        out[name] = {"result": _cpu(result), "calls": log.calls}
    return out


def _verdicts(per_rank: list[dict], p: int) -> dict[str, tuple[bool, str]]:
    """Each chapter's (passed, verdict), merging the ranks' raw results where the check needs them all."""
    from distlab.models import GPTConfig
    from distlab.parallel3d import make_batches, parity_3d, reference_run
    from distlab.pipeline.parity import merge, step_parity
    from distlab.pipeline.train import reference_step

    verdicts = {}
    for name in per_rank[0]:
        results = [rank[name]["result"] for rank in per_rank]
        if isinstance(results[0], tuple) and isinstance(results[0][0], bool):
            verdicts[name] = (all(ok for ok, _ in results), results[0][1])
        elif name == "pipeline":
            sizes = [8] + [16] * (2 * p) + [4]
            g = torch.Generator().manual_seed(3)
            X, y = torch.randn(4 * p, 8, generator=g), torch.randn(4 * p, 4, generator=g)
            reports = [step_parity(merge([rank[i] for rank in results]), reference_step(sizes, X, y),
                                   label=label) for i, label in enumerate(("1f1b", "interleaved"))]
            verdicts[name] = (all(r.passed for r in reports), "; ".join(r.verdict() for r in reports))
        elif name == "pipeline_gpt":
            from distlab.pipeline.gpt import gpt_reference_step

            config, idx, targets = _gpt_pipeline_problem(p)
            rep = step_parity(merge([rank[0] for rank in results]), gpt_reference_step(config, idx, targets),
                              label="GPT 1f1b, tied embedding")
            verdicts[name] = (rep.passed, rep.verdict())
        else:  # 3d
            plan = _plan_3d(p)
            config = GPTConfig(vocab_size=16, block_size=8, n_layer=2 * plan.pp, n_head=4, n_embd=16)
            batches = make_batches(config, 4 * plan.dp, 8, 2)
            rep = parity_3d(results, reference_run(config, batches), config, plan)
            verdicts[name] = (rep.passed, rep.verdict())
    return verdicts


@pytest.mark.parametrize("world", sorted({1, max(GPUS, 1)}))
def test_every_chapter_on_nccl(world, tmp_path):
    from distlab.gpu_check.rules import check_calls

    per_rank = launch.run(_every_chapter, world, str(tmp_path), backend="nccl", timeout=120)
    verdicts = _verdicts(per_rank, world)
    for name, (ok, verdict) in verdicts.items():
        print(f"{name}: {'ok' if ok else 'FAILED'}: {verdict}")
    failed = {n: v for n, (ok, v) in verdicts.items() if not ok}
    assert not failed, failed
    for name in per_rank[0]:
        findings = check_calls([rank[name]["calls"] for rank in per_rank], "cuda")
        assert findings == [], f"{name}: " + "; ".join(f.message for f in findings)


def _gloo_on_cuda() -> dict:
    """gloo with CUDA tensors: all_reduce and broadcast, the two collectives gloo runs on GPUs."""
    r, p = launch.rank(), launch.world_size()
    dev = torch.device("cuda", r % torch.cuda.device_count())
    x = torch.full((1000,), float(r + 1), device=dev)
    dist.all_reduce(x)
    y = torch.arange(5.0, device=dev) * (r + 1)
    dist.broadcast(y, src=0)
    return {"sum": x.cpu(), "broadcast": y.cpu(), "device": x.device.type, "want": p * (p + 1) / 2}


def test_gloo_over_cuda_tensors():
    for out in launch.run(_gloo_on_cuda, 2, backend="gloo"):
        assert out["device"] == "cuda"
        assert torch.equal(out["sum"], torch.full((1000,), out["want"]))
        assert torch.equal(out["broadcast"], torch.arange(5.0))


def test_cuda_peak_matches_the_predicted_peak():
    """Chapter 7: the step's torch.cuda.max_memory_allocated against the prediction (`memory.peak`)."""
    from distlab.gpu_check.bench import memory_check

    rows = memory_check()
    for row in rows:
        print(row)
    bad = [row for row in rows if not row["within_tolerance"]]
    assert not bad, bad
