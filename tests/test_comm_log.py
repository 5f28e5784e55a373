"""The one communication log (`distlab.comm_log`): what it records for every kind of c10d call, named by
mesh axis, labelled and phased, nested; and `ring_bytes`, the one home of the ring factors."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab import launch
from distlab.comm_log import CommRecord, comm_log, ring_bytes, where


def test_ring_bytes_per_op():
    b = 1200
    assert ring_bytes("all_reduce", b, 4) == 2 * 3 / 4 * b
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert ring_bytes(op, b, 4) == 3 / 4 * b
        assert ring_bytes(op, b, 3) == pytest.approx(2 / 3 * b)
    assert ring_bytes("broadcast", b, 4) == b and ring_bytes("send", b, 2) == b
    assert ring_bytes("all_reduce", b, 1) == 0 and ring_bytes("broadcast", b, 1) == 0
    assert ring_bytes("barrier", 0, 4) == 0
    # the sent bytes of a record are ring_bytes of its B and p; a recv sends nothing
    rec = CommRecord("all_reduce", "dp", 4, b, b // 4)
    assert rec.sent_bytes == ring_bytes("all_reduce", b, 4)
    assert CommRecord("recv", "pp", 2, b, b // 4, peer=0).sent_bytes == 0


def test_ring_bytes_rejects_bad_input():
    with pytest.raises(ValueError, match="op='allreduce' is not a collective the log knows; choose one of "
                                         "all_reduce"):
        ring_bytes("allreduce", 8, 2)
    with pytest.raises(ValueError, match="group_size=0 must be a positive integer"):
        ring_bytes("all_reduce", 8, 0)
    with pytest.raises(ValueError, match="nbytes=-1 must be >= 0"):
        ring_bytes("all_reduce", -1, 2)


def test_where_outside_a_log_does_nothing():
    with where("nothing to label"):
        x = torch.ones(2) + 1
    assert x.tolist() == [2.0, 2.0]


class _AllReduceBackward(torch.autograd.Function):
    """Identity forward, all-reduce over `group` backward (the shape of Megatron's f)."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        grad = grad.clone()
        with where("f"):
            dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _every_kind_of_call() -> dict:
    """On 4 ranks as grid(dp=2, tp=2): one call of each kind inside a log; what the log recorded."""
    import torch.distributed._functional_collectives as funcol

    from distlab.mesh import grid

    m = grid(dp=2, tp=2)
    tp, dp = m.get_group("tp"), m.get_group("dp")
    r_tp = dist.get_rank(tp)
    f32 = torch.float32
    with comm_log(mesh=m) as log:
        with log.where("step"):
            dist.all_reduce(torch.ones(6, dtype=torch.float64), group=tp)          # B = 48
            dist.all_gather_into_tensor(torch.empty(10), torch.ones(5), group=dp)  # B = 40 (the output)
            dist.all_gather([torch.empty(3), torch.empty(3)], torch.ones(3), group=dp)   # B = 24
            dist.reduce_scatter_tensor(torch.empty(4), torch.ones(8), group=dp)    # B = 32 (the input)
            with where("a2a"):
                dist.all_to_all_single(torch.empty(8), torch.ones(8))              # world, B = 32
                dist.all_to_all([torch.empty(2) for _ in range(4)], [torch.ones(2)] * 4)    # B = 32
            dist.broadcast(torch.ones(7, dtype=f32), src=dist.get_process_group_ranks(tp)[0],
                           group=tp, async_op=True).wait()                         # B = 28
        if r_tp == 0:
            dist.send(torch.ones(3), group_dst=1, group=tp)                         # B = 12
        else:
            dist.recv(torch.empty(3), group_src=0, group=tp)
        with comm_log() as inner:                                                   # nested, no mesh
            with inner.where("inner"):
                x = torch.ones(4, requires_grad=True)
                _AllReduceBackward.apply(x, tp).sum().backward()                    # backward, B = 16
                with where("sp-grads", phase="backward"):
                    dist.all_reduce(torch.ones(2), group=dp)                        # B = 8
                funcol.all_reduce(torch.ones(3), "sum", tp).wait()                  # DTensor's path, B = 12
    return {"records": log.records, "inner": inner.records, "tp_name": tp.group_name,
            "dp_name": dp.group_name,
            "bytes_dp": log.bytes(axis="dp"), "bytes_rs": log.bytes(axis="dp", op="reduce_scatter"),
            "calls_step": log.calls(where="step"), "calls_a2a": log.calls(where="a2a"),
            "calls_back": log.calls(phase="backward"), "sent_tp": log.sent_bytes(axis="tp"),
            "r_tp": r_tp}


def test_the_log_records_every_kind_of_call_by_mesh_axis():
    for rank, got in enumerate(launch.run(_every_kind_of_call, 4)):
        recs = got["records"]
        seen = [(r.op, r.axis, r.group_size, r.nbytes, r.where, r.phase) for r in recs]
        p2p = ("send" if got["r_tp"] == 0 else "recv", "tp", 2, 12, "", "forward")
        assert seen == [
            ("all_reduce", "tp", 2, 48, "step", "forward"),
            ("all_gather", "dp", 2, 40, "step", "forward"),
            ("all_gather", "dp", 2, 24, "step", "forward"),
            ("reduce_scatter", "dp", 2, 32, "step", "forward"),
            ("all_to_all", "world", 4, 32, "step/a2a", "forward"),
            ("all_to_all", "world", 4, 32, "step/a2a", "forward"),
            ("broadcast", "tp", 2, 28, "step", "forward"),
            p2p,
            ("all_reduce", "tp", 2, 16, "f", "backward"),
            ("all_reduce", "dp", 2, 8, "sp-grads", "backward"),
            ("all_reduce", "tp", 2, 12, "", "forward"),
        ], f"rank {rank}"
        assert recs[0].dtype == "float64" and recs[0].numel == 6 and recs[6].dtype == "float32"
        assert recs[7].peer == 1 - got["r_tp"]
        # the nested log saw the calls made while it was open, with its own label and without a mesh
        inner = [(r.op, r.axis, r.nbytes, r.where, r.phase) for r in got["inner"]]
        assert inner == [("all_reduce", got["tp_name"], 16, "inner/f", "backward"),
                         ("all_reduce", got["dp_name"], 8, "inner/sp-grads", "backward"),
                         ("all_reduce", got["tp_name"], 12, "inner", "forward")]
        # the queries
        assert got["bytes_dp"] == 40 + 24 + 32 + 8 and got["bytes_rs"] == 32
        assert got["calls_step"] == 7 and got["calls_a2a"] == 2 and got["calls_back"] == 2
        sent_p2p = 12 if got["r_tp"] == 0 else 0
        assert got["sent_tp"] == ring_bytes("all_reduce", 48, 2) + ring_bytes("broadcast", 28, 2) + sent_p2p \
            + ring_bytes("all_reduce", 16, 2) + ring_bytes("all_reduce", 12, 2)


def _powersgd_threads() -> dict:
    """On 2 ranks: a step of DDP with PyTorch's PowerSGD hook (compressing from the first step), seen by a
    thread-local log and by an all-threads one; then the same calls on a thread of our own."""
    import threading

    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 4))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                        min_compression_rate=1)
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
    for _ in range(2):  # PyTorch's hook all-reduces plainly before start_powerSGD_iter
        ddp(x).sum().backward()
    out: dict = {}
    with comm_log() as mine:
        with comm_log(all_threads=True) as every:
            with every.where("grads", phase="backward"), comm_log(all_threads=True) as nested:
                ddp(x).sum().backward()
    out["thread_local"] = [r.numel for r in mine.records if r.op == "all_reduce"]
    out["all_threads"] = [(r.op, r.numel, r.where, r.phase) for r in every.records]
    out["nested"] = [r.numel for r in nested.records]
    out["removed"] = not torch._C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_", "ADInplaceOrView")
    with comm_log(all_threads=True) as log:  # a thread of ours: its calls are seen, labelled by the log's
        worker = threading.Thread(target=lambda: dist.all_reduce(torch.ones(5)))
        with log.where("worker"):
            worker.start()
            worker.join()
    out["worker"] = [(r.op, r.numel, r.where) for r in log.records]
    return out


def test_an_all_threads_log_sees_the_powersgd_hooks_callbacks():
    """PyTorch's PowerSGD hook all-reduces the vectors at once, then P and Q in future callbacks on gloo's
    thread. A thread-local log sees the first, and the others only when they ran on its thread (a callback
    runs at once on the caller's thread if its future has already completed, which a busy machine makes
    likely); `all_threads=True` sees all three, each once, wherever they ran, and their values are the
    PowerSGD model's: a matrix n x m as P (n x r) and Q (m x r) where r (n + m) < n m."""
    r = 2
    shapes = [(64, 16), (64,), (4, 64), (4,)]
    vectors = sum(s[0] for s in shapes if len(s) == 1)
    ps = sum(n * min(n, m, r) for n, m in (s for s in shapes if len(s) == 2))
    qs = sum(m * min(n, m, r) for n, m in (s for s in shapes if len(s) == 2))
    assert all(min(n, m, r) * (n + m) < n * m for n, m in (s for s in shapes if len(s) == 2))
    for got in launch.run(_powersgd_threads, 2):
        seen_here = got["thread_local"]
        assert 1 <= len(seen_here) <= 3 and seen_here == [vectors, ps, qs][:len(seen_here)], seen_here
        assert got["all_threads"] == [("all_reduce", vectors, "grads", "backward"),
                                      ("all_reduce", ps, "grads", "backward"),
                                      ("all_reduce", qs, "grads", "backward")]
        assert got["nested"] == [vectors, ps, qs]  # a nested all-threads log records each call once too
        assert got["removed"]  # the kernels are gone when the log closes
        assert got["worker"] == [("all_reduce", 5, "worker")]
