"""NCCL's rules, checked on CPU (no GPU needed): what gloo accepts and a GPU node would not.

Pure tests (no ranks): the rendezvous simulator (`distlab.gpu_check.rendezvous`) on hand-made orders and
on every pipeline schedule as chapter 4's executor posts it, beside the chapter's own simulator; the
cross-rank check of recorded calls (`distlab.gpu_check.rules`) on calls that break each rule. One launch
of 2 ranks, under TORCH_DISTRIBUTED_DEBUG=DETAIL (gloo then checks every collective's fingerprint across
the ranks), runs chapters 1, 3, 4, 5, 6, 7 and 10's rank code inside the recording log and checks it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distlab import launch
from distlab.gpu_check.rendezvous import Op, check, pipeline_program
from distlab.gpu_check.rules import Call, check_calls, rule_log
from distlab.pipeline import make_schedule, validate

# (schedule, v): every schedule the executor runs with more than one rank
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)]


def _rules(findings) -> list[str]:
    return [f.rule for f in findings]


def test_head_to_head_sends_deadlock_unless_posted_together():
    """Both ranks send first: fine with buffered sends (gloo), a hang when a send waits for its receive."""
    alone = [[Op("send", 1, "x"), Op("recv", 1, "y")], [Op("send", 0, "y"), Op("recv", 0, "x")]]
    (finding,) = check(alone)
    assert finding.rule == "deadlock"
    assert "rank 0 at step 0 waits in send x to rank 1" in finding.message
    together = [[(Op("send", 1, "x"), Op("recv", 1, "y"))], [(Op("send", 0, "y"), Op("recv", 0, "x"))]]
    assert check(together) == []
    crossed = [[Op("send", 1, "x"), Op("recv", 1, "y")], [Op("recv", 0, "x"), Op("send", 0, "y")]]
    assert check(crossed) == []


def test_each_nccl_rule_is_named():
    any_source = [[Op("send", 1, "x")], [Op("recv", None, "x")]]
    assert _rules(check(any_source)) == ["any-source", "unmatched"]  # and rank 0's send then has no receive
    assert "name the sender (src=...)" in check(any_source)[0].message
    swapped = [[Op("send", 1, "a"), Op("send", 1, "b")], [Op("recv", 0, "b"), Op("recv", 0, "a")]]
    assert _rules(check(swapped)) == ["order", "order"]  # gloo's tags would sort them out; NCCL has none
    assert "in the order they are posted, without tags" in check(swapped)[0].message
    assert _rules(check([[Op("send", 1, "a")], []])) == ["unmatched"]
    mixed = [[Op("collective", name="all_reduce", group=(0, 1))],
             [Op("collective", name="all_gather", group=(0, 1))]]
    assert _rules(check(mixed)) == ["mismatch"]
    missing = [[Op("collective", name="barrier", group=(0, 1))], []]
    assert "call {0: 1, 1: 0} collectives" in check(missing)[0].message
    # a collective waits for its whole group: rank 1 enters it only after rank 0's send, which rank 1
    # receives after the collective, so each waits for the other
    cycle = [[Op("send", 1, "a"), Op("collective", name="ar", group=(0, 1))],
             [Op("collective", name="ar", group=(0, 1)), Op("recv", 0, "a")]]
    assert _rules(check(cycle)) == ["deadlock"]
    with pytest.raises(ValueError, match=r"program\[0\]\[0\] holds 'send'; a step is an Op"):
        check([["send"]])


def test_pipeline_schedules_as_the_executor_posts_them_on_nccl():
    """steps_on_rank builds every schedule with rendezvous_safe=True on NCCL and p2p.py posts each run of
    messages as one batch_isend_irecv group: that order must finish when sends wait for receives. Our
    simulator and the chapter's (validate(..., "nccl")) must give the same verdict on every schedule."""
    verdicts = {}
    for name, v in SCHEDULES:
        for p in (2, 3):
            for m in (2, 3, 4):
                if name == "interleaved" and m % p:
                    continue
                for safe in (False, True):
                    schedule = make_schedule(name, p, m, v, rendezvous_safe=safe)
                    ours = check(pipeline_program(schedule))
                    try:
                        validate(schedule, "nccl")
                        theirs = True
                    except ValueError:
                        theirs = False
                    assert (ours == []) == theirs, (name, p, m, safe, ours)
                    verdicts[(name, p, m, safe)] = ours == []
    assert all(ok for (_, _, _, safe), ok in verdicts.items() if safe)
    # without rendezvous_safe, ZB-V and interleaved 1F1B with m > p can hang on NCCL even batched
    assert not verdicts[("zbv", 2, 4, False)] and not verdicts[("interleaved", 2, 4, False)]
    assert verdicts[("1f1b", 3, 4, False)]  # 1F1B's batched runs are safe as they are
    # and posting the messages one blocking call at a time would hang 1F1B: why p2p.py batches on NCCL
    assert _rules(check(pipeline_program(make_schedule("1f1b", 2, 4), batched=False))) == ["deadlock"]
    assert check(pipeline_program(make_schedule("1f1b", 2, 4, rendezvous_safe=True), batched=False)) == []


def test_recorded_calls_that_break_nccl_rules():
    ar = Call("all_reduce", (0, 1), "float32", 8, ("cuda",))
    assert check_calls([[ar], [ar]], "cuda") == []
    on_cpu = Call("all_reduce", (0, 1), "float32", 8, ("cpu",), where="grads")
    (f,) = check_calls([[ar], [on_cpu]], "cuda")
    assert f.rule == "device" and "rank 1, call 0 (all_reduce in grads): a tensor on cpu" in f.message
    other_dtype = Call("all_reduce", (0, 1), "float64", 8, ("cuda",))
    assert _rules(check_calls([[ar], [other_dtype]])) == ["mismatch"]
    send = Call("send", (0, 1), "float32", 4, ("cpu",), peer=1)
    anywhere = Call("recv", (0, 1), "float32", 4, ("cpu",), any_source=True)
    assert _rules(check_calls([[send], [anywhere]], "cpu"))[0] == "any-source"
    with pytest.raises(ValueError, match="device has 3 entries for 2 ranks"):
        check_calls([[], []], ["cuda"] * 3)


def _chapters_under_the_log() -> dict:
    """On each of 2 ranks: chapters' public rank code inside one RuleLog each; their recorded calls."""
    from distlab.collectives import ring_all_reduce
    from distlab.context_parallel.parity import attention_parity
    from distlab.data_parallel import train_data_parallel
    from distlab.memory.zero import ShardedOptimizer
    from distlab.models import GPTConfig
    from distlab.moe.parity import ParityCase, parity_one
    from distlab.pipeline.train import steps_on_rank
    from distlab.reference import mlp_task
    from distlab.tensor_parallel import compare_with_dense

    r, dev = launch.rank(), launch.device()
    task = mlp_task(sizes=(4, 8, 3), n=24)
    config = GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=2, n_embd=8)
    runs = {
        "collectives": lambda: ring_all_reduce(torch.arange(5.0, device=dev) + r),
        "data_parallel": lambda: train_data_parallel(task, "overlapped", steps=2, global_batch=6),
        "pipeline": lambda: steps_on_rank([("1f1b", 2, 1), ("interleaved", 2, 2)], [4, 8, 8, 8, 3],
                                          task.inputs[:8], task.targets[:8]),
        "tensor_parallel": lambda: compare_with_dense(config, batch=1, seq=4, device=dev),
        "moe": lambda: parity_one(ParityCase([5, 3], num_experts=2, k=1)),
        "context_parallel": lambda: attention_parity(seq_len=8, batch=1, heads=1, head_dim=4),
    }

    def zero() -> None:
        model = task.build(0).to(dev)
        opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-2)
        task.loss(model, task.inputs[r:4:2].to(dev), task.targets[r:4:2].to(dev)).backward()
        opt.step()

    runs["zero"] = zero
    calls = {}
    for name, fn in runs.items():
        with rule_log() as log:
            fn()
        calls[name] = log.calls
    with rule_log() as log:  # a receive from any source: fine on gloo, impossible on NCCL
        t = torch.zeros(2)
        dist.send(t, dst=1) if r == 0 else dist.recv(t)
    calls["any_source"] = log.calls
    return calls


def test_chapters_rank_code_keeps_nccl_rules(monkeypatch):
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    per_rank = launch.run(_chapters_under_the_log, 2)
    for chapter in per_rank[0]:
        calls = [rank[chapter] for rank in per_rank]
        assert all(calls), f"{chapter}: a rank recorded no call; the log did not see its communication"
        findings = check_calls(calls, "cpu")
        if chapter == "any_source":
            assert _rules(findings) == ["any-source", "unmatched"]
        else:
            assert findings == [], f"{chapter}: " + "; ".join(f.message for f in findings)
