"""Command line: check the tensor-parallel GPT against the dense one and count its communication.

    python -m distlab.tensor_parallel --tp 2 4                # ranks as CPU processes (gloo)
    torchrun --nproc-per-node 4 -m distlab.tensor_parallel    # one GPU per rank (NCCL)

Every rank builds the dense GPT from the same seed, loads its shard, runs one forward and backward
step, and compares logits, loss and every gradient with the dense model; rank 0 prints the worst
difference and the collectives of the step beside the analytic count (`accounting.expected_records`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch

from distlab import launch
from distlab.models import GPTConfig
from distlab.tensor_parallel import accounting as acc
from distlab.tensor_parallel.comm import TPGroup
from distlab.tensor_parallel.parity import ParityReport, compare_with_dense

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _step(args: argparse.Namespace) -> ParityReport:
    config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads,
                       n_embd=args.hidden)
    return compare_with_dense(config, TPGroup.world(), args.batch, args.seq, seed=0, dtype=DTYPES[args.dtype],
                              sequence_parallel=args.sequence_parallel, device=launch.device())


def describe(rep: ParityReport, args: argparse.Namespace) -> str:
    """The report's verdict and its communication beside the analytic count, as text."""
    config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads,
                       n_embd=args.hidden)
    expected = acc.expected_records(config, args.batch, args.seq, rep.tp_size, args.sequence_parallel,
                                    torch.finfo(DTYPES[args.dtype]).bits // 8)
    same = "same" if acc.summary(rep.records) == acc.summary(expected) else "DIFFERENT"
    lines = [str(rep), f"  collectives: {len(rep.records)} recorded, {len(expected)} expected, "
             f"{same} sizes and places"]
    for phase in acc.PHASES:
        got = sum(acc.wire_bytes(r.op, r.nbytes, rep.tp_size) for r in rep.records if r.phase == phase)
        lines.append(f"  {phase:<8}: {got / 1e6:9.3f} MB sent per rank (ring algorithms)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[str]:
    """Parse the arguments; under torchrun every rank works and rank 0 prints, else start the ranks."""
    parser = argparse.ArgumentParser(prog="python -m distlab.tensor_parallel",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[2],
                        help="tensor-parallel sizes (without torchrun)")
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=48)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=24)
    parser.add_argument("--dtype", choices=list(DTYPES), default="float64")
    args = parser.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rep = launch.under_torchrun(_step, args)
        out = [describe(rep, args)]
        if int(os.environ["RANK"]) == 0:
            print(out[0], flush=True)
        return out
    out = []
    for p in args.tp:
        out.append(describe(launch.run(_step, p, args)[0], args))
        print(out[-1], flush=True)
    return out


if __name__ == "__main__":
    main()
