"""Chapter 9, part 4: a real 2-"node" job on one machine (distlab.parallel3d.multinode).

Two torchrun agents, `--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d` at one free port of
127.0.0.1, run the (dp=2, tp=2) trainer of `checkpoint.train`. Each rank reports torchrun's GROUP_RANK
(its node) and LOCAL_RANK and its tp group: every tp group must lie inside one node (the mesh's inner
dim), and the losses must equal the single-process reference (float64, tolerance 1e-10; see
test_parallel3d_checkpoint.py). The agents run in their own sessions and are killed on a timeout.
"""

from __future__ import annotations

import json

import pytest
import torch

from distlab.parallel3d.checkpoint.train import TrainConfig, reference_losses
from distlab.parallel3d.multinode import check_layout, run_local_nodes, sbatch_script, torchrun_command

STEPS = 3


def test_two_nodes_keep_tp_inside_a_node_and_train_like_one_process(tmp_path):
    run_local_nodes(["-m", "distlab.parallel3d.restart", "--dp", "2", "--tp", "2", "--steps", str(STEPS),
                     "--every", "0", "--dir", str(tmp_path), "--report-dir", str(tmp_path)],
                    nnodes=2, nproc_per_node=2, timeout=180)
    reports = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(4)]
    node = {rep["rank"]: rep["group_rank"] for rep in reports}
    assert sorted(node.values()) == [0, 0, 1, 1]  # two ranks on each "node"
    for rep in reports:
        assert rep["rank"] == 2 * rep["group_rank"] + rep["local_rank"]  # torchrun numbers node by node
        assert len(rep["tp_peers"]) == 2 and {node[p] for p in rep["tp_peers"]} == {rep["group_rank"]}
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        want = reference_losses(TrainConfig(), STEPS)
    finally:
        torch.set_default_dtype(old)
    for rep in reports:
        assert len(rep["losses"]) == STEPS
        assert all(abs(a - b) < 1e-10 for a, b in zip(rep["losses"], want, strict=True)), rep["rank"]


def test_commands_for_the_book():
    script = sbatch_script(dp=4, tp=4, nnodes=2, gpus_per_node=8)
    for needle in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                   "scontrol show hostnames", "srun torchrun", "--nnodes 2", "--nproc-per-node 8",
                   "--rdzv-backend c10d", "--rdzv-endpoint $MASTER_ADDR:29500", "--max-restarts 1",
                   "--dp 4 --tp 4"):
        assert needle in script, needle
    line = torchrun_command("m", [], nnodes=2, nproc_per_node=2, endpoint="127.0.0.1:1234", node_rank="1")
    assert "--node-rank 1" in line and "--rdzv-endpoint 127.0.0.1:1234" in line


@pytest.mark.parametrize(("sizes", "needle"), [
    ((2, 2, 2, 4), "dp x tp = 2 x 2 = 4 ranks, but nnodes x nproc_per_node = 2 x 4 = 8 processes"),
    ((1, 16, 2, 8), "tp=16 does not divide nproc_per_node=8, so a tp group would span two nodes"),
    ((3, 3, 3, 4), "dp x tp = 3 x 3 = 9 ranks, but nnodes x nproc_per_node = 3 x 4 = 12"),
    ((0, 2, 1, 2), "dp=0 must be a positive integer"),
])
def test_bad_layouts_are_refused(sizes, needle):
    with pytest.raises(ValueError) as err:
        check_layout(*sizes)
    assert needle in str(err.value)
