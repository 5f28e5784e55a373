"""The exercise checks: they pass a correct all-reduce and explain each kind of broken one.

The library's own ring_all_reduce and a two-level all-reduce written with its trees play the correct
student; the broken
students below each make one classic mistake, and each test asserts the explanation, not just a failure.
Launches are expensive (seconds each on 2 cores), so the broken variants share one launch: it calls
the same in-rank code (`_run_cases`) and report code (`_summarise`) as the public checks.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

from distlab import launch
from distlab.collectives import all_reduce_diagnosis as diag
from distlab.collectives import (
    chunk_bounds,
    ring_all_reduce,
    segmented_ring_all_reduce,
    tree_broadcast,
    tree_reduce,
)
from distlab.collectives import exercises as ex

# --- broken students ------------------------------------------------------------------------------


def _swap(send: torch.Tensor, to: int, recv: torch.Tensor, frm: int) -> None:
    works = [dist.irecv(recv, frm)] if recv.numel() else []
    works += [dist.isend(send.clone(), to)] if send.numel() else []
    for work in works:
        work.wait()


def _ring(tensor, rs_steps=None, gather=True, add_in_gather=False, bounds=None):
    """A hand-written ring all-reduce whose mistakes can be switched on one at a time."""
    p, r = dist.get_world_size(), dist.get_rank()
    b = bounds or chunk_bounds(tensor.numel(), p)
    nxt, prv = (r + 1) % p, (r - 1) % p
    for s in range(p - 1 if rs_steps is None else rs_steps):
        (slo, shi), (rlo, rhi) = b[(r - s - 1) % p], b[(r - s - 2) % p]
        buf = torch.empty(rhi - rlo)
        _swap(tensor[slo:shi], nxt, buf, prv)
        tensor[rlo:rhi] += buf
    for s in range(p - 1 if gather else 0):
        (slo, shi), (rlo, rhi) = b[(r - s) % p], b[(r - s - 1) % p]
        buf = torch.empty(rhi - rlo)
        _swap(tensor[slo:shi], nxt, buf, prv)
        if add_in_gather:
            tensor[rlo:rhi] += buf
        else:
            tensor[rlo:rhi] = buf
    return tensor


def returns_none(tensor):
    ring_all_reduce(tensor)


def not_in_place(tensor):
    out = tensor.clone()
    return ring_all_reduce(out)


def does_nothing(tensor):
    return tensor


def averages(tensor):
    return ring_all_reduce(tensor).div_(dist.get_world_size())


def reduces_twice(tensor):
    return ring_all_reduce(ring_all_reduce(tensor))


def floor_chunks(tensor):  # n // p elements per chunk: the last n % p elements are never sent
    p, m = dist.get_world_size(), tensor.numel() // dist.get_world_size()
    return _ring(tensor, bounds=[(k * m, (k + 1) * m) for k in range(p)])


RING_VARIANTS = {
    "correct": ring_all_reduce,
    "returns_none": returns_none,
    "not_in_place": not_in_place,
    "does_nothing": does_nothing,
    "no_all_gather": lambda t: _ring(t, gather=False),
    "adds_in_all_gather": lambda t: _ring(t, add_in_gather=True),
    "short_reduce_scatter": lambda t: _ring(t, rs_steps=dist.get_world_size() - 2),
    "averages": averages,
    "reduces_twice": reduces_twice,
    "floor_chunks": floor_chunks,
}


def two_level(tensor, node, across):
    tree_reduce(tensor, dst=0, group=node)
    if dist.get_rank(node) == 0:
        segmented_ring_all_reduce(tensor, group=across)
    return tree_broadcast(tensor, src=0, group=node)


def no_inter_node(tensor, node, across):
    tree_reduce(tensor, dst=0, group=node)
    return tree_broadcast(tensor, src=0, group=node)


def no_intra_node(tensor, node, across):
    return ring_all_reduce(tensor, group=across)


TWO_LEVEL_VARIANTS = {"correct": two_level, "no_inter_node": no_inter_node, "no_intra_node": no_intra_node}


def _every_variant(counts):
    out = {name: diag._run_cases(fn, counts, None) for name, fn in RING_VARIANTS.items()}
    for name, fn in TWO_LEVEL_VARIANTS.items():
        out[f"two-level {name}"] = diag._run_cases(fn, counts, 2)
    return out


@pytest.fixture(scope="module")
def reports():
    """Every variant on 4 ranks, in one launch: name -> the report of its case."""
    counts = diag.default_counts(4)
    per_rank = launch.run(_every_variant, 4, counts)
    return {name: ex._summarise("4 ranks", counts, [per_rank[r][name] for r in range(4)], 4)
            for name in per_rank[0]}


def _text(case) -> str:
    return "\n".join(case.lines)


# --- the diagnoses --------------------------------------------------------------------------------

def test_correct_implementations_pass_in_the_shared_launch(reports):
    assert reports["correct"].passed and reports["correct"].lines == []
    assert reports["two-level correct"].passed


@pytest.mark.parametrize("variant, expected", [
    ("returns_none", "the function returned None on rank 0: return the tensor"),
    ("not_in_place", "the input was not modified in place on rank 0"),
    ("does_nothing", "the tensor on rank 0 is unchanged (it still equals rank 0's own input)"),
    ("no_all_gather", "only chunk 0 is correct on rank 0: did the all-gather phase run?"),
    ("adds_in_all_gather", "more than once (up to 4 times): a chunk was added twice"),
    ("short_reduce_scatter", "chunk 0 (elements 0:4) on rank 0 equals rank 0's own input: that chunk was "
                             "never reduced"),
    ("short_reduce_scatter", "every wrong chunk on rank 0 holds one rank's data only"),
    ("averages", "the whole tensor on rank 0: values are 4 times too small: the sum was divided by 4"),
    ("reduces_twice", "values are p = 4 times too large: every rank's data was added 4 times, so a chunk "
                      "was added twice"),
    ("floor_chunks", "elements 12:14 of chunk 3 on rank 0 equals rank 0's own input: those elements were "
                     "never reduced"),
    ("floor_chunks", "it fails only when p = 4 does not divide n"),
    ("two-level no_inter_node", "it holds only node 0's sum, so the inter-node phase is missing"),
    ("two-level no_intra_node", "it holds only the ranks with the same local index, so the intra-node "
                                "phase is missing"),
])
def test_each_mistake_gets_its_explanation(reports, variant, expected):
    case = reports[variant]
    assert not case.passed
    assert expected in _text(case), _text(case)


def test_report_details_the_largest_failing_count_and_lists_the_rest(reports):
    lines = reports["does_nothing"].lines
    assert lines[0] == "with n = 14 elements:"
    assert "  (all ranks [0, 1, 2, 3] are wrong, in the same way)" in lines
    assert lines[-1] == "also wrong for n = [1, 5, 8]"
    floor = reports["floor_chunks"].lines
    assert "right for n = [8]" in floor and "also wrong for n = [1, 5]" in floor


@pytest.mark.parametrize("got, i, expected", [
    (float("nan"), 0, ("nan",)),
    (0.0, 2, ("zero",)),
    (12.25, 0, ("odd",)),
])
def test_signature_of_single_values(got, i, expected):
    # p = 3 (base 8, 8**3 = 512): the right sum at element i is 1 + 8 + 64 + 512 * 3 * (i + 1)
    want = 73 + 512 * 3 * (i + 1)
    assert diag._signature(got, want, i, rank=0, p=3) == expected


def test_signature_decodes_whose_data_and_how_often():
    p, i = 3, 1
    value = lambda counts: sum(c * 8**q for q, c in enumerate(counts)) + 512 * (i + 1) * sum(counts)  # noqa: E731
    want = value((1, 1, 1))
    assert diag._signature(value((1, 1, 1)), want, i, 0, p) == ("ok",)
    assert diag._signature(value((0, 1, 0)), want, i, 1, p) == ("own",)
    assert diag._signature(value((2, 1, 1)), want, i, 0, p) == ("mix", (2, 1, 1))
    assert diag._signature(value((1, 0, 1)), want, i, 0, p) == ("mix", (1, 0, 1))
    assert diag._signature(value((2, 2, 2)), want, i, 0, p) == ("times", 2)
    assert diag._signature(value((1, 1, 1)) + 512 * 3, want, i, 0, p) == ("shift",)  # element 2's data


def test_encoded_inputs_are_exact_in_float32_at_the_largest_sizes():
    for p in range(1, diag.MAX_RANKS + 1):
        n = diag.MAX_COUNT
        total = sum(diag.encoded_input(r, p, n).double() for r in range(p))
        assert torch.equal(total.float().double(), total), p  # the float32 sum loses nothing
        assert all(diag._signature(v, v, i, 0, p) == ("ok",) for i, v in enumerate(total.tolist()))


# --- end to end, through the public checks --------------------------------------------------------

def test_correct_ring_passes_on_1_to_3_ranks():  # and on 4 ranks in the shared launch above
    result = ex.check_ring_all_reduce(ring_all_reduce, world_sizes=(1, 2, 3), progress=False)
    assert result.passed and bool(result)
    assert [c.label for c in result.cases] == ["1 rank", "2 ranks", "3 ranks"]
    assert str(result).startswith("check_ring_all_reduce: PASSED (3 of 3 passed)")
    assert "✓ pass" in result._repr_html_()
    result.raise_if_failed()


def test_correct_two_level_passes():  # 2 nodes x 2 ranks runs in the shared launch above
    result = ex.check_two_level_all_reduce(two_level, layouts=((2, 1),), progress=False)
    assert result.passed, str(result)
    assert result.cases[0].label == "2 nodes x 1 rank"


def test_failure_report_prints_and_raises():
    result = ex.check_ring_all_reduce(returns_none, world_sizes=(2,), counts=(3,), progress=False)
    assert not result
    text = str(result)
    assert text.startswith("check_ring_all_reduce: FAILED (0 of 1 passed)")
    assert "[FAIL] 2 ranks" in text and "returned None on rank 0: return the tensor" in text
    assert "✗ fail" in result._repr_html_()
    with pytest.raises(AssertionError, match="returned None on rank 0"):
        result.raise_if_failed()


def skips_the_first_send(tensor):
    if dist.get_rank() == 0:
        return tensor  # rank 0 never sends, so rank 1 waits for ever
    return ring_all_reduce(tensor)


def test_a_hang_is_explained_as_a_missing_message():
    result = ex.check_ring_all_reduce(skips_the_first_send, world_sizes=(2,), counts=(4,), timeout=2.0,
                                      progress=False)
    assert not result.passed
    assert "waited for a message that never came" in str(result)
    assert "every send has a matching recv" in str(result)


def raises_on_rank_1(tensor):
    if dist.get_rank() == 1:
        raise ValueError("chunk index out of range")
    return ring_all_reduce(tensor)


def test_an_exception_names_the_rank_and_the_error():
    result = ex.check_ring_all_reduce(raises_on_rank_1, world_sizes=(2,), counts=(4,), progress=False)
    assert "rank 1 raised an exception: ValueError: chunk index out of range" in str(result)


@pytest.mark.parametrize("kwargs, message", [
    ({"fn": 3}, "fn=3 is not a function"),
    ({"fn": ring_all_reduce, "world_sizes": (0, 2)}, "world_sizes=(0, 2) must hold whole numbers from 1"),
    ({"fn": ring_all_reduce, "world_sizes": (9,)}, "from 1 to 8"),
    ({"fn": ring_all_reduce, "counts": (0,)}, "counts=[0] must be element counts from 1 to 30"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ex.check_ring_all_reduce(progress=False, **kwargs)


def test_bad_layouts_are_named():
    with pytest.raises(ValueError, match=r"layouts must be \(nodes, ranks_per_node\) pairs"):
        ex.check_two_level_all_reduce(two_level, layouts=(4,), progress=False)
    with pytest.raises(ValueError, match=r"nodes \* ranks_per_node=\(12,\) must hold"):
        ex.check_two_level_all_reduce(two_level, layouts=((3, 4),), progress=False)


def receives_into_the_chunk_it_sends(tensor):
    """The classic index slip: at step s, recv into chunk (r - s) % p, the one this rank sends."""
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = [tensor[a:b] for a, b in chunk_bounds(tensor.numel(), p)]
    for s in range(p - 1):
        incoming = torch.empty_like(chunks[(r - s) % p])
        request = dist.isend(chunks[(r - s) % p], (r + 1) % p)
        dist.recv(incoming, (r - 1) % p)
        request.wait()
        chunks[(r - s) % p].add_(incoming)
    return tensor


def test_a_wrong_chunk_index_is_named_without_gloos_noise(capsys):
    """gloo aborts a rank whose message is longer than its buffer ("Received data size doesn't match
    expected size"); the check says which sizes and chunks differ, and prints none of gloo's lines."""
    result = ex.check_ring_all_reduce(receives_into_the_chunk_it_sends, world_sizes=(3,), counts=(1,),
                                      timeout=5.0, progress=False)
    printed = capsys.readouterr().out
    assert not result and "received a message of 1 element(s) into a recv buffer of 0" in str(result)
    assert "the chunks hold [1, 0, 0] elements: the message was chunk 0" in str(result), str(result)
    assert "timed out" not in str(result)
    assert not re.search("gloo|terminate called|Connection reset|GLHF", printed), printed
