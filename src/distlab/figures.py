"""Write every static figure the book uses: `python -m distlab.figures OUTDIR`.

The book's pages include these files by name from book/figures/ (generated, not committed: `make book`
and the book-build test run this first). Each entry of BOOK_FIGURES pairs a file name with the package
function that draws it, so the book, the labs and the tests show the same picture. A new chapter adds
its figures to BOOK_FIGURES, and nowhere else.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import NamedTuple

from matplotlib.figure import Figure

from distlab.async_sgd import figures as async_sgd
from distlab.collectives import figures as collectives
from distlab.collectives.cost_model import MachineParams
from distlab.collectives.traces import COLLECTIVES
from distlab.context_parallel import figures as context_parallel
from distlab.data_parallel import figures as data_parallel
from distlab.fault_tolerance import curves as fault_tolerance_curves
from distlab.fault_tolerance import figures as fault_tolerance
from distlab.hardware import figures as hardware
from distlab.memory import figures as memory
from distlab.memory.fp8 import figures as fp8_figures
from distlab.memory.muon import figures as muon_figures
from distlab.moe import figures as moe
from distlab.moe import scale_figures as moe_scale
from distlab.observe import figures as observe
from distlab.parallel3d import figures as parallel3d
from distlab.pipeline import dualpipe_v_figures as dualpipe_v
from distlab.pipeline import figures as pipeline
from distlab.plan import figures as plan
from distlab.tensor_parallel import figures as tensor_parallel


class BookFigure(NamedTuple):
    """One file of book/figures: its name, the function that draws it, and what it shows."""

    filename: str
    make: Callable[[], Figure]
    shows: str


def cost_model_example() -> Figure:
    """The book's cost-model figure. Its parameters are illustrative, not measured, and the title says so:
    8 ranks, 4 per node, alpha = 5 µs, 1/beta = 10 GB/s, 1/gamma = 50 GB/s."""
    params = MachineParams(alpha=5e-6, beta=1 / 10e9, gamma=1 / 50e9)
    return collectives.cost_model_figure(params, p=8, ranks_per_node=4,
                                         note="Illustrative example, not a measurement: ")


BOOK_FIGURES: tuple[BookFigure, ...] = (
    # Chapter 1: collectives
    *(BookFigure(f"semantics-{c}.png", partial(collectives.semantics_figure, c, 4), f"{c} on 4 ranks")
      for c in COLLECTIVES),
    BookFigure("ring-all-reduce-steps.png", partial(collectives.ring_all_reduce_steps_figure, 4),
               "every step of ring all-reduce on 4 ranks"),
    BookFigure("binomial-tree-broadcast.png", partial(collectives.binomial_tree_figure, 8),
               "binomial-tree broadcast on 8 ranks"),
    BookFigure("recursive-doubling.png", partial(collectives.recursive_doubling_figure, 8),
               "recursive-doubling all-reduce partners on 8 ranks"),
    BookFigure("hierarchical-all-reduce.png", partial(collectives.hierarchical_all_reduce_figure, 2, 4),
               "the phases of the two-level all-reduce, 2 nodes x 4 ranks"),
    BookFigure("cost-model-algorithms.png", cost_model_example,
               "predicted all-reduce time vs message size, example parameters"),
    # Chapter 2: data parallelism
    BookFigure("dp-buckets.png", data_parallel.book_bucket_figure,
               "the small GPT's parameters in 16 KiB buckets"),
    BookFigure("dp-timeline.png", data_parallel.book_timeline_figure,
               "predicted step timelines of the three gradient-sync strategies, example parameters"),
    BookFigure("dp-scaling.png", data_parallel.book_scaling_figure,
               "predicted data-parallel throughput vs ranks, example parameters"),
    # Chapter 3: asynchronous SGD
    BookFigure("async-schedules.png", async_sgd.schedule_figure,
               "simulated schedules of sync, SSP (s=1) and async, 3 workers, worker 1 4x slower"),
    BookFigure("async-staleness.png", async_sgd.simulated_staleness_figure,
               "staleness histograms of the same simulated runs"),
    BookFigure("staleness-cost.png", async_sgd.staleness_cost_figure,
               "largest stable learning rate vs delay; the MLP trained with delayed gradients"),
    # Chapter 4: pipeline parallelism
    BookFigure("pipeline-schedules.png", partial(pipeline.schedules_figure, 4, 8, 2),
               "naive, GPipe, 1F1B and interleaved timelines, p=4, m=8, v=2, simulated"),
    BookFigure("pipeline-bubble.png", partial(pipeline.bubble_figure, 4),
               "bubble fraction vs microbatches, formula and simulation, p=4"),
    BookFigure("pipeline-stash.png", partial(pipeline.stash_figure, 4, 8, 2),
               "peak stashed microbatches per rank, GPipe vs 1F1B vs interleaved, p=4, m=8"),
    BookFigure("pipeline-zero-bubble.png", partial(pipeline.zero_bubble_figure, 4, 8),
               "1F1B, ZB-H1 and ZB-V timelines with W boxes, p=4, m=8, t_f = t_b = t_w, simulated"),
    # Chapter 5: tensor parallelism
    BookFigure("tp-matmul-splits.png", tensor_parallel.split_figure,
               "which rank holds which block of X, A and Y for the column and the row split, 4 ranks"),
    BookFigure("tp-qkv-shards.png", tensor_parallel.qkv_shard_figure,
               "rows of the packed c_attn weight per rank: by heads vs naive blocks, 4 heads, 2 ranks"),
    BookFigure("tp-comm-volume.png", tensor_parallel.comm_volume_figure,
               "bytes per rank per layer vs hidden size, sequence length and TP size; pipeline for scale"),
    BookFigure("tp-link-time.png", tensor_parallel.link_time_figure,
               "per-layer compute at peak vs TP all-reduce time on NVLink and InfiniBand"),
    BookFigure("tp-sequence-parallel.png", tensor_parallel.sequence_parallel_figure,
               "one layer under sequence parallelism: regions, their splits, the collectives between"),
    # Chapter 6: mixture of experts
    BookFigure("moe-routing-histogram.png", moe.routing_histogram_figure,
               "tokens per expert from a fresh router, skew 0 and 1, E=8, k=1, capacity factor 1.25"),
    BookFigure("moe-drop-rate.png", moe.drop_rate_figure,
               "fraction of assignments dropped vs capacity factor, per skew, k=1 and k=2, E=8"),
    BookFigure("moe-load-balancing.png", moe.load_balancing_figure,
               "load imbalance and drops during training, without and with the aux loss (0.01)"),
    BookFigure("moe-send-matrix.png", moe.send_matrix_figure,
               "rows each rank sends each rank in the dispatch all-to-all, 4 ranks, E=8, k=2"),
    # Chapter 7: memory
    BookFigure("memory-breakdown.png", memory.breakdown_figure,
               "predicted bytes per GPU of GPT-3 175B under seven parallel configurations"),
    BookFigure("memory-activations-vs-seq.png", memory.activations_vs_seq_figure,
               "one layer's activation bytes vs sequence length per recomputation policy, h=4096, a=32"),
    BookFigure("memory-recompute-tradeoff.png", memory.recompute_tradeoff_figure,
               "bytes kept vs FLOPs recomputed: keep-all, selective, full and cost-aware plans"),
    BookFigure("memory-loss-scale.png", memory.loss_scale_figure,
               "the dynamic loss scale of a forced-overflow fp16 run, skipped steps marked"),
    BookFigure("memory-fp16-underflow.png", memory.underflow_figure,
               "histogram of a small GPT's gradients against fp16's range, at scale 1 and 2^16"),
    BookFigure("memory-muon-layouts.png", muon_figures.layouts_figure,
               "distributed Muon: predicted step of gather-to-owner over all-to-all, by width and ranks"),
    # Chapter 8: the hardware underneath
    BookFigure("hw-bandwidth-generations.png", hardware.bandwidth_generations_figure,
               "per-direction GB/s of PCIe, NVLink and InfiniBand generations, from the catalog"),
    BookFigure("hw-dgx1-cube-mesh.png", hardware.cube_mesh_figure,
               "the DGX-1 hybrid cube-mesh and a ring through it, bottleneck marked"),
    BookFigure("hw-all-reduce-vs-size.png", hardware.all_reduce_vs_size_figure,
               "predicted all-reduce time vs size: flat ring, two-level ring, tree on 4 DGX A100"),
    BookFigure("hw-all-reduce-vs-nodes.png", hardware.all_reduce_vs_nodes_figure,
               "predicted all-reduce time vs number of DGX A100 servers"),
    # Chapter 9: putting it together
    BookFigure("p3d-mesh.png", partial(parallel3d.mesh_figure, 2, 2, 2),
               "the ranks of grid(dp=2, pp=2, tp=2) and which talk to which over each mesh axis"),
    BookFigure("p3d-placement.png", parallel3d.placement_figure,
               "predicted communication per step of each mesh axis, three placements on two DGX A100"),
    BookFigure("planner-candidates.png", partial(plan.candidates_figure, "llama3-405b-8k"),
               "every planner candidate for Llama 3 405B's 8K stage: memory vs predicted step time"),
    BookFigure("planner-terms.png", partial(plan.published_terms_figure, "megatron-1t"),
               "the predicted step of Megatron-LM's 1T model term by term: published vs planner"),
    # Chapter 10: context parallelism
    BookFigure("cp-work-per-rank.png", partial(context_parallel.work_figure, 4),
               "attention work per rank, contiguous vs zig-zag layout, p=4, from the formula"),
    BookFigure("cp-ring-steps.png", partial(context_parallel.ring_steps_figure, 4, "zigzag"),
               "the K/V block each rank holds at each ring step and the blocks it computes, zig-zag, p=4"),
    BookFigure("cp-memory-vs-seq.png", context_parallel.memory_figure,
               "predicted saved bytes of one attention layer per rank vs sequence length, 32 heads x 128"),
    # Chapter 6 at scale
    BookFigure("moe-dispatch-cost.png", moe_scale.dispatch_cost_figure,
               "predicted flat / hierarchical dispatch time vs servers, k = 1-8, M = 4, DGX A100 and H100"),
    BookFigure("moe-published-runs.png", moe_scale.published_runs_figure,
               "published MoE runs: layout, batch, reported throughput, experts per rank, parameter counts"),
    BookFigure("cp-ulysses-vs-ring.png", context_parallel.ulysses_vs_ring_figure,
               "bytes per rank and predicted time per layer vs cp: ring, Ulysses and the hybrid, DGX H100"),
    BookFigure("pipeline-dualpipev.png", dualpipe_v.dualpipev_figure,
               "ZB-V and DualPipeV simulated, p=4, m=10, chunks carrying t_c=0.5; pairs outlined"),
    # Chapter 11: fault tolerance (parts 1-2)
    BookFigure("ft-hsdp-cluster.png", fault_tolerance.hsdp_cluster_figure,
               "predicted communication per step and model states per GPU, HSDP vs ZeRO-3, 7B on DGX H100"),
    BookFigure("ft-goodput.png", fault_tolerance.goodput_figure,
               "useful steps per hour vs failure rate: checkpoint-restart (Daly, Young) vs healing replicas"),
    # Chapter 11: fault tolerance (sections 3-4)
    BookFigure("ft-break-even.png", fault_tolerance_curves.break_even_figure,
               "seconds per step of progress vs link speed, data parallelism vs DiLoCo, N = 1e9, R = 2"),
    # Chapter 7: FP8 training
    BookFigure("memory-fp8-formats.png", fp8_figures.formats_figure,
               "every positive number of E4M3 and E5M2, from their bit layouts"),
    BookFigure("memory-fp8-speedup.png", fp8_figures.speedup_figure,
               "predicted FP8-over-bf16 speedup of one matmul on an H100 vs size, casts included"),
    BookFigure("memory-fp8-measured.png", fp8_figures.measured_speedup_figure,
               "FP8-over-bf16 speed-up on an H200: measured, the roofline and the measured-cost model"),
    # Chapter 13: seeing inside a run (measured when the book is built, on this machine's CPU)
    BookFigure("observe-trace.png", observe.book_trace_figure,
               "one traced step of overlapped data parallelism on 2 gloo ranks, a row per rank and thread"),
    BookFigure("observe-memory.png", observe.book_memory_figure,
               "live bytes over one GPT training step on the CPU beside chapter 7's predicted peak"),
)


def write_figures(outdir: str | Path, names: Sequence[str] | None = None, dpi: int = 150) -> list[Path]:
    """Draw the BOOK_FIGURES named in `names` (all if None) into `outdir`; return the paths written."""
    known = {f.filename: f for f in BOOK_FIGURES}
    wanted = list(known) if names is None else list(names)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; choose from {', '.join(known)}")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in wanted:
        path = out / name
        known[name].make().savefig(path, dpi=dpi, bbox_inches="tight")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m distlab.figures OUTDIR [--only NAME ...] [--dpi 150]`."""
    parser = argparse.ArgumentParser(prog="python -m distlab.figures", description=__doc__.split("\n")[0])
    parser.add_argument("outdir", help="folder to write the PNG files into (created if missing)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="write only these files")
    parser.add_argument("--dpi", type=int, default=150, help="resolution of the PNG files (default 150)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        written = write_figures(args.outdir, args.only, args.dpi)
    except ValueError as e:
        parser.error(str(e))
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} figures in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")  # a script needs no window; set here, not on import, to leave notebooks alone
    sys.exit(main())
