"""Command line: check the tensor-parallel GPT against the dense one and count its communication.

    python -m distlab.tensor_parallel --world-size 2 4         # ranks as CPU processes (gloo)
    torchrun --nproc-per-node 4 -m distlab.tensor_parallel     # one GPU per rank (NCCL)

Every rank builds the dense GPT from the same seed, loads its shard, runs one forward and backward
step, and compares logits, loss and every gradient with the dense model; rank 0 prints the verdict
against the dtype's tolerance and the collectives of the step beside the analytic count
(`cost_model.expected_records`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

import torch

from distlab import launch
from distlab.cli_types import DTYPES, add_dtype, add_json, add_seed, positive_int
from distlab.models import GPTConfig
from distlab.tensor_parallel import cost_model
from distlab.tensor_parallel.model import check_config
from distlab.tensor_parallel.parity import TPParityReport, compare_with_dense


def _config(args: argparse.Namespace) -> GPTConfig:
    return GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads,
                     n_embd=args.hidden)


def _step(args: argparse.Namespace) -> TPParityReport:
    return compare_with_dense(_config(args), args.batch, args.seq, seed=args.seed, dtype=DTYPES[args.dtype],
                              sequence_parallel=args.sequence_parallel, device=launch.device())


def summarize(rep: TPParityReport, args: argparse.Namespace) -> dict:
    """The report as data: verdict, recorded against expected collectives, bytes sent per rank."""
    expected = cost_model.expected_records(_config(args), args.batch, args.seq, rep.tp_size,
                                           args.sequence_parallel, torch.finfo(DTYPES[args.dtype]).bits // 8)
    sent = {phase: sum(cost_model.wire_bytes(r.op, r.nbytes, rep.tp_size) for r in rep.records
                       if r.phase == phase) for phase in cost_model.PHASES}
    return {"tp_size": rep.tp_size, "sequence_parallel": rep.sequence_parallel,
            "dtype": str(rep.dtype).removeprefix("torch."),
            "passed": rep.passed, "verdict": rep.verdict(), "max_abs_diff": rep.worst(),
            "collectives_recorded": len(rep.records), "collectives_expected": len(expected),
            "same_as_expected": cost_model.summary(rep.records) == cost_model.summary(expected),
            "bytes_sent_per_rank": sent}


def describe(summary: dict) -> str:
    """A summary as text."""
    same = "same" if summary["same_as_expected"] else "DIFFERENT"
    lines = [summary["verdict"], f"  collectives: {summary['collectives_recorded']} recorded, "
             f"{summary['collectives_expected']} expected, {same} sizes and places"]
    for phase, sent in summary["bytes_sent_per_rank"].items():
        lines.append(f"  {phase:<8}: {sent / 1e6:9.3f} MB sent per rank (ring algorithms)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The options, each with its default in the help."""
    p = argparse.ArgumentParser(prog="python -m distlab.tensor_parallel", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--world-size", type=positive_int, nargs="+", default=[2], metavar="N",
                   help="tensor-parallel sizes to run, one launch each (ignored under torchrun)")
    p.add_argument("--sequence-parallel", action="store_true", help="split the sequence outside the layers")
    p.add_argument("--batch", type=positive_int, default=2, help="sequences per batch")
    p.add_argument("--seq", type=positive_int, default=16, help="tokens per sequence (also the block size)")
    p.add_argument("--hidden", type=positive_int, default=48, help="hidden size n_embd")
    p.add_argument("--heads", type=positive_int, default=12, help="attention heads n_head")
    p.add_argument("--layers", type=positive_int, default=2, help="transformer layers n_layer")
    p.add_argument("--vocab", type=positive_int, default=24, help="vocabulary size")
    add_dtype(p, "float64", "dtype of both models")
    add_seed(p, "seed of the weights and the batch")
    add_json(p)
    return p


def validate(p: argparse.ArgumentParser, args: argparse.Namespace, sizes: Sequence[int]) -> None:
    """A usage error (`parser.error`, exit status 2) for any value the run cannot take."""
    for n in sizes:
        try:
            check_config(_config(args), n)
        except ValueError as e:
            p.error(f"argument --world-size: {e}")
        if args.sequence_parallel and args.seq % n:
            p.error(f"argument --seq: {args.seq} is not divisible by --world-size {n}; sequence "
                    f"parallelism gives every rank seq/{n} tokens: choose a multiple of {n}")


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Parse the arguments; under torchrun every rank works and rank 0 prints, else start the ranks."""
    p = parser()
    args = p.parse_args(argv)
    if args.hidden >= 1 and args.heads >= 1 and args.hidden % args.heads:
        p.error(f"argument --hidden: {args.hidden} is not divisible by --heads {args.heads}")
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    validate(p, args, [int(os.environ["WORLD_SIZE"])] if torchrun else args.world_size)
    out = [summarize(rep, args) for rep in _runs(args, torchrun)]
    if not torchrun or int(os.environ["RANK"]) == 0:
        _print(out, args.json)
    return out


def _runs(args: argparse.Namespace, torchrun: bool) -> list:
    """Under torchrun this rank's report; else one launch per --world-size, rank 0's report of each."""
    if torchrun:
        return [launch.under_torchrun(_step, args)]
    return [launch.run(_step, n, args)[0] for n in args.world_size]


def _print(out: list[dict], as_json: bool) -> None:
    """The runs' summaries, as JSON or as one description each."""
    print(json.dumps(out, indent=1) if as_json else "\n".join(describe(s) for s in out), flush=True)


if __name__ == "__main__":
    main()
