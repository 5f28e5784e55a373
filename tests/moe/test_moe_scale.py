"""Chapter 6 at scale: hierarchical (node-limited) dispatch on real ranks against the flat all-to-all and
the single-process layer, and its bytes across nodes against the log and the model.

One launch of 4 ranks runs every world size: the whole world (2 nodes x 2 and 4 nodes x 1), ranks
{0, 1, 2} (3 nodes x 1), each half of grid(dp=2, ep=2) (2 nodes x 1, a rank with no tokens) and each
rank alone (one node). Starting ranks costs seconds, so the sizes share one start. float64: the three
versions add the same terms in different orders; 1e-10 separates that from a bug (`distlab.parity`).
"""

from __future__ import annotations

import pytest

from distlab import launch, mesh
from distlab.moe.hierarchical_parity import HierCase, hierarchical_parity

CASES = {
    4: [HierCase([3, 5, 7, 9], 8, k=3, ranks_per_node=2, max_nodes=1),
        HierCase([5, 5, 5, 5], 8, k=4, ranks_per_node=1, max_nodes=2, seed=1),
        HierCase([5, 5, 5, 5], 8, k=4, ranks_per_node=2, seed=2),
        HierCase([6, 0, 6, 6], 4, k=2, ranks_per_node=1, collapsed=True)],  # others' experts get nothing
    3: [HierCase([4, 2, 5], 6, k=3, ranks_per_node=1, max_nodes=2)],
    2: [HierCase([0, 7], 4, k=2, ranks_per_node=1, max_nodes=1)],
    1: [HierCase([6], 4, k=2, ranks_per_node=1)],
}


def _on_ranks() -> dict:
    import torch.distributed as dist

    r = dist.get_rank()
    out = {4: hierarchical_parity(CASES[4])}
    three = dist.new_group([0, 1, 2])
    if r < 3:
        out[3] = hierarchical_parity(CASES[3], three)
    out[2] = hierarchical_parity(CASES[2], mesh.grid(dp=2, ep=2)["ep"].get_group())
    out[1] = hierarchical_parity(CASES[1], mesh.grid(dp=4, ep=1)["ep"].get_group())
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return launch.run(_on_ranks, 4, timeout=60)


def test_hierarchical_and_flat_dispatch_match_the_reference_and_each_other(results):
    for rank, res in enumerate(results):
        for p, rows in res.items():
            for result in rows:
                for name, report in result.reports.items():
                    assert report.passed, f"rank {rank}, p={p}, {name}: {report.verdict()} {report.flat()}"
                    assert report.verdict().endswith(": ok")
    assert sorted(results[0]) == [1, 2, 3, 4] and 3 not in results[3]


def test_a_token_reaches_at_most_max_nodes(results):
    for res in results:
        for rows in res.values():
            for result in rows:
                limit = result.case.max_nodes or len(result.case.sizes) // result.case.ranks_per_node
                assert result.max_nodes_reached <= limit


def test_bytes_across_nodes_logged_equal_the_split_sizes_and_the_routing(results):
    for rank, res in enumerate(results):
        for p, rows in res.items():
            for result in rows:
                hier, flat = result.stats["hierarchical"], result.stats["flat"]
                # every byte of the "inter" steps crosses nodes, so the log measures them directly
                assert result.logged_inter == hier.cross_node_bytes, (rank, p, result.case.label())
                # the flat all-to-all's log counts every row that leaves the rank, in and out of the node
                row = flat.row_bytes
                assert result.logged_flat == row * (flat.cross_dispatch + flat.local_dispatch
                                                    + flat.cross_combine + flat.local_combine)
                # the rows follow from this rank's routing alone, (flat, hierarchical)
                assert result.predicted_rows == (flat.cross_dispatch, hier.cross_dispatch)
                assert hier.cross_dispatch <= flat.cross_dispatch
    for p in (4, 2):  # what the ranks send across nodes, they receive back in the combine
        for c in range(len(CASES[p])):
            group = [res[p][c] for res in (results if p == 4 else results[:2])]
            for mode in ("hierarchical", "flat"):
                assert sum(g.stats[mode].cross_dispatch for g in group) == \
                    sum(g.stats[mode].cross_combine for g in group)


def test_node_limit_saves_bytes_across_nodes(results):
    # 2 nodes x 2 ranks, k = 3, M = 1: one row per token crosses at most once (if at all); flat sends
    # one row per expert that is on the other node
    cross = [res[4][0].stats for res in results]
    assert sum(s["hierarchical"].cross_dispatch for s in cross) < sum(s["flat"].cross_dispatch for s in cross)
    assert sum(s["flat"].cross_node_bytes for s in cross) > sum(s["hierarchical"].cross_node_bytes
                                                                 for s in cross)


def test_sizes_must_match_the_group():
    with pytest.raises(ValueError, match=r"sizes=\[3, 4\] must give one token count per rank \(1 ranks\)"):
        hierarchical_parity([HierCase([3, 4], 4, k=2, ranks_per_node=1)])
