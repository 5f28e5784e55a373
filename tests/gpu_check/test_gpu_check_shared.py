"""Many ranks on one GPU (issue 34, item 2): every chapter's multi-rank code with 4 ranks sharing cuda:0.

NCCL gives each rank a GPU of its own, so a node with one GPU cannot run 4 NCCL ranks. gloo can move
CUDA tensors, and `DISTLAB_DEVICE=cuda` puts every gloo rank's tensors on the shared GPU
(`distlab.launch.devices`). Each chapter's check of tests/gpu_check/test_gpu.py then runs on 4 ranks inside a
`RuleLog` whose device is the rank's (`cuda:0`): every tensor handed to a collective must be on it, as
under NCCL. The results leave the ranks on the CPU and are compared there with one process's reference.
gloo stages the CUDA tensors of its collectives through host memory but not those of send and recv,
so a chapter built on messages (chapter 1's rings, the pipeline) stops at its first one, with that
reason; it is printed, not failed, and it is what only a node with a GPU per rank can run.
Marked `gpu` (make gpu-check runs it); skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from distlab import launch

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]
RANKS = 4
# a chapter whose ranks exchange messages stops here (gpu_check.rules): gloo's send and recv take host
# memory only, a limit of gloo, not of the chapter's code; it is listed, not counted as a failure
GLOO_P2P = "over gloo: gloo sends and receives host memory only"


def _shared_chapters(root: str) -> dict:
    """On each gloo rank, tensors on the shared cuda:0: every chapter's check inside a device RuleLog."""
    from distlab.gpu_check.rules import rule_log
    from tests.gpu_check.test_gpu import _checks, _cpu  # the chapters' checks, as the NCCL test runs them

    p, dev = launch.world_size(), launch.device()
    assert launch.backend() == "gloo" and dev == torch.device("cuda", 0), (launch.backend(), dev)
    out: dict = {}
    for name, check in _checks(p, dev, root).items():
        with rule_log(device=dev) as log:
            try:
                result = check()
            except Exception as e:  # one chapter's failure must not hide the others'
                result = (False, f"raised {type(e).__name__}: {e}")
        out[name] = {"result": _cpu(result), "device_errors": log.device_errors}
    return out


def test_every_chapter_with_four_ranks_sharing_one_gpu(tmp_path, monkeypatch):
    from tests.gpu_check.test_gpu import _verdicts

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("DISTLAB_DEVICE", "cuda")
    per_rank = launch.run(_shared_chapters, RANKS, str(tmp_path), backend="gloo", timeout=120)
    verdicts = _verdicts(per_rank, RANKS)
    for name, (ok, verdict) in verdicts.items():
        print(f"{name}: {'ok' if ok else 'FAILED'}: {verdict}")
    errors = {name: rank[name]["device_errors"] for rank in per_rank for name in rank
              if rank[name]["device_errors"]}
    failed = {n: v for n, (ok, v) in verdicts.items() if not ok and GLOO_P2P not in v}
    assert not failed and not errors, (failed, errors)
    assert len(failed) < len(verdicts), "every chapter stopped at gloo's point-to-point limit"
